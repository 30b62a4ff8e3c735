//! The read-only subcommands (`status`, `incidents`): fetch JSON from a running agent's API
//! and print it for people. Rendering works on `serde_json::Value` so that an agent of
//! another version still prints what both understand.

pub mod api_client;
pub mod incident_table;
pub mod status;
mod table;

use self::api_client::ApiClient;

/// `datapath-monitor incidents [--json]`: recent incidents, newest first.
pub fn incidents(server: &str, json: bool) -> anyhow::Result<String> {
    let incidents = ApiClient::new(server)?.get_json("/api/v1/incidents")?;
    if json {
        return Ok(serde_json::to_string_pretty(&incidents)? + "\n");
    }
    Ok(incident_table::render_incidents(&incidents))
}

/// `datapath-monitor status`: interfaces, probes and the lifecycle state.
pub fn status(server: &str) -> anyhow::Result<String> {
    let client = ApiClient::new(server)?;
    let ready = client.get_json("/readyz")?;
    let interfaces = client.get_json("/api/v1/interfaces")?;
    let lifecycle = client.get_json("/api/v1/lifecycle")?;
    let events = client.get_json("/api/v1/events")?;
    Ok(status::render_status(server, &ready, &interfaces, &lifecycle, &events))
}
