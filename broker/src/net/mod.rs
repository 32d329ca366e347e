//! Listeners and connections: frames in, responses out, in request order. Knows
//! nothing of storage; every request goes to `handlers`. The outbound side,
//! requests this broker sends to controllers and leaders, is `runtime::peer`.

mod admin_http;
mod connection;

pub use admin_http::serve_admin;
pub use connection::serve_listener;
