//! How an error reaches a person: its message and each of its sources, on one line.
//!
//! The agent's own errors never repeat their source in their message (the source is reached
//! through `source()`); some libraries' errors do (aya's `program error: {0}`), so a source
//! whose text the chain already holds is left out. Every error a person reads (logs, CLI,
//! `/readyz`, `attach_error`) is printed through [`chain`].

use std::error::Error;

/// `error` and its sources, joined by ": ", each text once.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
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

    /// Like aya's errors: the message embeds the source it also returns.
    #[derive(Debug, thiserror::Error)]
    #[error("program error: {0}")]
    struct Embedding(#[from] Outer);

    #[test]
    fn each_source_once_in_order() {
        let error = Outer { path: "/x", source: std::io::Error::other("denied") };
        assert_eq!(chain(&error), "reading /x: denied");
        let wrapped = anyhow::Error::new(error).context("starting");
        assert_eq!(chain(wrapped.as_ref()), "starting: reading /x: denied");
        assert_eq!(chain(wrapped.as_ref()), format!("{wrapped:#}"));
    }

    #[test]
    fn a_source_the_message_already_holds_is_not_repeated() {
        let error = Embedding::from(Outer { path: "/x", source: std::io::Error::other("denied") });
        assert_eq!(chain(&error), "program error: reading /x: denied");
        let wrapped = anyhow::Error::new(error).context("loading");
        assert_eq!(chain(wrapped.as_ref()), "loading: program error: reading /x: denied");
    }
}
