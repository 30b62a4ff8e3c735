//! A blocking HTTP client for a running agent's JSON API.

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

/// A blocking HTTP client for the agent's API.
pub struct ApiClient {
    server: String,
    agent: ureq::Agent,
}

impl ApiClient {
    pub fn new(server: &str) -> anyhow::Result<Self> {
        let server = server.trim_end_matches('/').to_string();
        if !server.starts_with("http://") {
            bail!("--server must be an http:// URL, got {server:?}");
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Self { server, agent })
    }

    /// GETs `path` and parses JSON; /readyz answers 503 with a useful body, so any status with JSON is accepted.
    pub fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.server);
        let mut response =
            self.agent.get(&url).call().with_context(|| format!("GET {url} (is the agent running? see --server)"))?;
        let status = response.status();
        let body = response.body_mut().read_to_string().with_context(|| format!("reading {url}"))?;
        serde_json::from_str(&body).with_context(|| format!("GET {url}: HTTP {status}: not JSON: {}", body.trim()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_must_be_http() {
        assert!(ApiClient::new("https://example").is_err());
        assert!(ApiClient::new("http://127.0.0.1:9781/").is_ok());
    }
}
