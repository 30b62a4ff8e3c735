//! How an error reaches a person: its message and each of its sources, on one line.
//!
//! Errors here follow one rule: a message never repeats its source (the source is reached
//! through `source()`), so printing the chain says everything exactly once.

use std::error::Error;

/// `error` and its sources, joined by ": " (as anyhow's `{:#}` prints them).
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {path}")]
    struct Outer {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn each_source_once_in_order() {
        let error = Outer { path: "/x", source: std::io::Error::other("denied") };
        assert_eq!(chain(&error), "reading /x: denied");
        let wrapped = anyhow::Error::new(error).context("starting");
        assert_eq!(chain(wrapped.as_ref()), "starting: reading /x: denied");
        assert_eq!(chain(wrapped.as_ref()), format!("{wrapped:#}"));
    }
}
