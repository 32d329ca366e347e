//! Listeners and connections: frames in, responses out, in request order. Knows
//! nothing of storage; every request goes to `handlers`.

mod admin_http;
mod connection;

pub use admin_http::serve_admin;
pub use connection::serve_listener;
