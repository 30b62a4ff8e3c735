//! The report: a summary table of every figure next to its goal, then one section per
//! measurement with its method and raw figures. Text after [`NOTES_MARKER`] in an existing
//! report is hand-written analysis and is kept across runs.

use std::fmt::Write as _;

pub const NOTES_MARKER: &str = "<!-- Hand-written notes below this line are kept when the report is regenerated. -->";

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// No goal: recorded for the reader.
    Info,
}

pub struct Figure {
    pub name: String,
    pub measured: String,
    pub goal: String,
    pub verdict: Verdict,
}

impl Figure {
    pub fn goal(name: impl Into<String>, measured: impl Into<String>, goal: impl Into<String>, met: bool) -> Self {
        let verdict = if met { Verdict::Met } else { Verdict::Missed };
        Self { name: name.into(), measured: measured.into(), goal: goal.into(), verdict }
    }

    pub fn info(name: impl Into<String>, measured: impl Into<String>) -> Self {
        Self { name: name.into(), measured: measured.into(), goal: "—".into(), verdict: Verdict::Info }
    }
}

pub struct Section {
    pub title: String,
    pub figures: Vec<Figure>,
    /// Markdown: method and detail tables.
    pub body: String,
}

pub struct Header {
    pub command: String,
    pub machine: String,
    pub date: String,
    pub duration_minutes: f64,
    pub quick: bool,
}

pub fn render(header: &Header, sections: &[Section], kept_notes: Option<&str>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmarks\n");
    let _ = writeln!(
        out,
        "What datapath-monitor costs the datapath and the node, and how fast it sees a disruption. \
         Every figure below comes from one run of\n\n```\n{}\n```\n\non {} ({}), which took {:.0} minutes. \
         The bench builds the agent in release mode, sets up its own namespaces and traffic, and measures \
         side by side: with and without the monitor in the same run, as ratios. Tests never assert timings; \
         this is where they are recorded.\n",
        header.command, header.machine, header.date, header.duration_minutes
    );
    if header.quick {
        let _ = writeln!(out, "**This is a `--quick` run: fewer rounds and shorter runs; not for the record.**\n");
    }
    let _ = writeln!(out, "## Summary\n\n| figure | measured | goal | |\n|---|---|---|---|");
    for section in sections {
        for figure in &section.figures {
            let mark = match figure.verdict {
                Verdict::Met => "met",
                Verdict::Missed => "**missed**",
                Verdict::Info => "",
            };
            let _ = writeln!(out, "| {} | {} | {} | {mark} |", figure.name, figure.measured, figure.goal);
        }
    }
    for section in sections {
        let _ = writeln!(out, "\n## {}\n\n{}", section.title, section.body.trim_end());
    }
    let _ = writeln!(out, "\n{NOTES_MARKER}\n");
    if let Some(notes) = kept_notes {
        out.push_str(notes.trim_start_matches('\n'));
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// The hand-written notes of an existing report, if any.
pub fn kept_notes(existing: &str) -> Option<&str> {
    let (_, notes) = existing.split_once(NOTES_MARKER)?;
    let notes = notes.trim();
    (!notes.is_empty()).then_some(notes)
}

/// A markdown table.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n|{}\n", header.join(" | "), "---|".repeat(header.len()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_survive_a_regeneration() {
        let header = Header {
            command: "cargo xtask bench".into(),
            machine: "m".into(),
            date: "d".into(),
            duration_minutes: 1.0,
            quick: false,
        };
        let sections = [Section {
            title: "T".into(),
            figures: vec![Figure::goal("f", "1", "≥ 0", true), Figure::info("g", "2")],
            body: "body".into(),
        }];
        let first = render(&header, &sections, None);
        assert!(first.contains("| f | 1 | ≥ 0 | met |"));
        assert_eq!(kept_notes(&first), None);
        let edited = format!("{first}\n## Analysis\nkeep me\n");
        let second = render(&header, &sections, kept_notes(&edited));
        assert!(second.ends_with("## Analysis\nkeep me\n"), "{second}");
        assert_eq!(kept_notes(&second), Some("## Analysis\nkeep me"));
    }
}
