//! The agent's clock: CLOCK_MONOTONIC (the clock of the kernel's `bpf_ktime_get_ns`) to order
//! events and measure durations, and the wall clock to show them.

/// Nanoseconds of CLOCK_MONOTONIC: the same clock as the kernel's `bpf_ktime_get_ns()`.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec; both clocks exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// A point in time on both clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    /// CLOCK_MONOTONIC nanoseconds: use for ordering and durations.
    pub mono_ns: u64,
    /// Wall clock: use for output.
    pub wall: jiff::Timestamp,
}

impl Stamp {
    pub fn now() -> Self {
        let mono_ns = monotonic_ns();
        Self { mono_ns, wall: jiff::Timestamp::now() }
    }

    /// The wall time of a CLOCK_MONOTONIC reading taken earlier (e.g. by a kernel program).
    pub fn from_monotonic(mono_ns: u64) -> Self {
        let now = Self::now();
        let behind = now.mono_ns.saturating_sub(mono_ns);
        let ahead = mono_ns.saturating_sub(now.mono_ns);
        let wall = now
            .wall
            .checked_sub(jiff::SignedDuration::from_nanos(behind as i64))
            .and_then(|wall| wall.checked_add(jiff::SignedDuration::from_nanos(ahead as i64)))
            .unwrap_or(now.wall);
        Self { mono_ns, wall }
    }

    /// Seconds from `self` to `later` on the monotonic clock (negative when `later` is earlier).
    pub fn seconds_until(&self, later: &Stamp) -> f64 {
        (later.mono_ns as i128 - self.mono_ns as i128) as f64 / 1e9
    }
}

/// RFC 3339 in UTC with milliseconds, e.g. `2026-01-12T20:58:46.230Z`.
pub fn rfc3339(wall: jiff::Timestamp) -> String {
    format!("{wall:.3}")
}

/// Parses an RFC 3339 timestamp (any offset).
pub fn parse_rfc3339(text: &str) -> Result<jiff::Timestamp, String> {
    text.parse::<jiff::Timestamp>().map_err(|error| format!("not an RFC 3339 time: {text:?}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_with_offsets() {
        let parsed = parse_rfc3339("2026-01-12T21:58:46.230+01:00").unwrap();
        assert_eq!(rfc3339(parsed), "2026-01-12T20:58:46.230Z");
        assert!(parse_rfc3339("yesterday").is_err());
    }

    #[test]
    fn monotonic_stamps_map_to_wall_time() {
        let now = Stamp::now();
        let earlier = Stamp::from_monotonic(now.mono_ns - 1_500_000_000);
        let gap = now.wall.duration_since(earlier.wall).as_secs_f64();
        assert!((gap - 1.5).abs() < 0.05, "{gap}");
    }
}
