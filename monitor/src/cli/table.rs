//! Plain-text tables for people: cells from JSON values (control characters escaped, so a
//! field stays on one line and cannot drive the terminal) and left-aligned columns.

use serde_json::Value;

/// Left-aligned columns, two spaces apart, under a header.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths = column_widths(Some(header), rows);
    let mut out = format_row(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>(), &widths);
    for row in rows {
        out.push_str(&format_row(row, &widths));
    }
    out
}

/// A string field (`-` when missing or empty), a number or a bool as JSON prints it.
pub(super) fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => clean(s),
        Value::Number(_) | Value::Bool(_) => value.to_string(),
        Value::Array(_) | Value::Object(_) => clip(&clean(&value.to_string()), 60),
    }
}

/// Replaces control characters (newlines, terminal escapes from file names or process
/// details) by their escaped form, so one field stays on one line and cannot drive the terminal.
pub(super) fn clean(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

pub(super) fn clip(s: &str, max_chars: usize) -> String {
    if s.chars().count() <= max_chars {
        return s.to_string();
    }
    let mut clipped: String = s.chars().take(max_chars).collect();
    clipped.push('…');
    clipped
}

/// The width of each column but the last (which is not padded).
pub(super) fn column_widths(header: Option<&[&str]>, rows: &[Vec<String>]) -> Vec<usize> {
    let mut widths: Vec<usize> = header.map(|h| h.iter().map(|c| c.chars().count()).collect()).unwrap_or_default();
    for row in rows {
        if widths.len() < row.len() {
            widths.resize(row.len(), 0);
        }
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    widths
}

/// One line of left-aligned columns, two spaces apart, without trailing blanks.
pub(super) fn format_row(cells: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    for (i, cell) in cells.iter().enumerate() {
        if i + 1 == cells.len() {
            line.push_str(cell);
        } else {
            let width = widths.get(i).copied().unwrap_or(0);
            let pad = width.saturating_sub(cell.chars().count());
            line.push_str(cell);
            line.extend(std::iter::repeat_n(' ', pad + 2));
        }
    }
    let mut line = line.trim_end().to_string();
    line.push('\n');
    line
}
