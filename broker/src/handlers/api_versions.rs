//! ApiVersions: which APIs and versions this broker speaks, and its frame bound.

use std::rc::Rc;

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::{wire, ApiKey, ErrorCode};

use super::{finish, Reply};
use crate::shard::Shard;

fn body(error: ErrorCode, frame_size_bytes_max: u32) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let ranges: Vec<_> = ApiKey::ALL
        .iter()
        .map(|api| {
            let (min, max) = api.versions();
            wire::ApiVersionRange::create(
                &mut fbb,
                &wire::ApiVersionRangeArgs {
                    api_key: *api as u16,
                    min_version: min,
                    max_version: max,
                },
            )
        })
        .collect();
    let apis = fbb.create_vector(&ranges);
    let root = wire::ApiVersionsResponse::create(
        &mut fbb,
        &wire::ApiVersionsResponseArgs {
            error_code: error.code(),
            apis: Some(apis),
            frame_size_max: frame_size_bytes_max,
        },
    );
    finish(fbb, root)
}

pub(super) fn handle(shard: &Rc<Shard>) -> Reply {
    Reply::Body {
        body: body(ErrorCode::None, shard.config().frame_size_bytes_max),
        payload: Vec::new(),
    }
}

/// The answer to an unknown API or version: the error and what is supported.
pub(super) fn unsupported(error: ErrorCode) -> Vec<u8> {
    body(error, 0)
}
