//! The controller's broker-facing API: the metadata records it replicates and
//! sends (`records`), the request and answer types (`messages`), and their
//! flatbuffers codec (`codec`, protocol/schema/controller.fbs and admin.fbs).
//! The controller serves it; a broker's controller link and the tools call it.

pub mod codec;
pub mod messages;
pub mod records;
