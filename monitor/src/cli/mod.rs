//! The read-only subcommands (`status`, `incidents`) that print a running agent's state.

pub mod api_client;
pub mod incident_table;

pub use api_client::{incidents, status};
