//! How a process ended, from the wait status the kernel reports at its exit.

/// How a process ended, from its wait status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// `exit(code)`.
    Exited(u8),
    /// Terminated by a signal.
    Killed { signal: i32, core_dumped: bool },
}

impl ExitStatus {
    /// Decodes a wait status: low 7 bits the signal, bit 7 core dumped, bits 8..15 the code.
    pub fn from_wait_status(status: u32) -> Self {
        match (status & 0x7f) as i32 {
            0 => Self::Exited(((status >> 8) & 0xff) as u8),
            signal => Self::Killed { signal, core_dumped: status & 0x80 != 0 },
        }
    }

    /// `exited with code 3`, `killed by SIGKILL (core dumped)`.
    pub fn describe(&self) -> String {
        match self {
            Self::Exited(code) => format!("exited with code {code}"),
            Self::Killed { signal, core_dumped } => {
                let core = if *core_dumped { " (core dumped)" } else { "" };
                format!("killed by {}{core}", signal_name(*signal))
            }
        }
    }

    /// As [`ExitStatus::describe`], after "pid N": `exited with code 3`, `was killed by SIGTERM`.
    pub(super) fn describe_after_pid(&self) -> String {
        match self {
            Self::Exited(_) => self.describe(),
            Self::Killed { .. } => format!("was {}", self.describe()),
        }
    }
}

fn signal_name(signal: i32) -> String {
    match nix::sys::signal::Signal::try_from(signal) {
        Ok(known) => known.as_str().to_string(),
        Err(_) => format!("signal {signal}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_statuses_decode() {
        let cases = [
            (0, ExitStatus::Exited(0), "exited with code 0"),
            (3 << 8, ExitStatus::Exited(3), "exited with code 3"),
            (255 << 8, ExitStatus::Exited(255), "exited with code 255"),
            (15, ExitStatus::Killed { signal: 15, core_dumped: false }, "killed by SIGTERM"),
            (9, ExitStatus::Killed { signal: 9, core_dumped: false }, "killed by SIGKILL"),
            (0x80 | 11, ExitStatus::Killed { signal: 11, core_dumped: true }, "killed by SIGSEGV (core dumped)"),
            (0x80 | 6, ExitStatus::Killed { signal: 6, core_dumped: true }, "killed by SIGABRT (core dumped)"),
            (40, ExitStatus::Killed { signal: 40, core_dumped: false }, "killed by signal 40"),
        ];
        for (status, expected, text) in cases {
            let decoded = ExitStatus::from_wait_status(status);
            assert_eq!(decoded, expected, "{status:#x}");
            assert_eq!(decoded.describe(), text, "{status:#x}");
        }
    }
}
