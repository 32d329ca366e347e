//! Request handlers, one file per API. This is where flatbuffers are decoded
//! and built: below this layer the broker uses its own types. A handler
//! returns the response body and payload, no response (acks=0), or a reason to
//! close the connection (a body that fails verification).

mod admin;
mod api_versions;
mod coordinators;
pub mod fetch;
mod groups;
mod list_offsets;
mod metadata;
mod produce;
pub mod producers;
pub mod transactions;
mod txn_coordinator;

use std::net::SocketAddr;
use std::rc::Rc;

use bytes::Bytes;

use protocol::flatbuffers::{FlatBufferBuilder, Follow, Verifiable};
use protocol::frame::{decode_request, encode_response, RequestHeader};
use protocol::{ApiKey, ErrorCode};

use crate::shard::Shard;

/// What the connection does with a request's result.
#[derive(Debug)]
pub enum Outcome {
    /// Send the frame bytes (length prefix, correlation id, body) then the payload parts.
    Respond { head: Vec<u8>, payload: Vec<Bytes> },
    /// acks=0: nothing is sent.
    NoResponse,
    /// The request is malformed beyond an error code: close the connection.
    Close(String),
}

/// A handler's answer before framing.
pub(crate) enum Reply {
    Body { body: Vec<u8>, payload: Vec<Bytes> },
    None,
}

pub(crate) type HandlerResult = Result<Reply, String>;

/// Decodes and answers one request frame (the bytes after the length prefix).
pub async fn handle(
    shard: &Rc<Shard>,
    frame: &Bytes,
    peer: SocketAddr,
) -> (Option<ApiKey>, Outcome) {
    let request = match decode_request(frame) {
        Ok(r) => r,
        Err(e) => return (None, Outcome::Close(format!("bad request frame: {e}"))),
    };
    let header = request.header;
    let Some(api) = header.api() else {
        return (
            None,
            respond(
                &header,
                api_versions::unsupported(ErrorCode::UnsupportedVersion),
            ),
        );
    };
    let (min, max) = api.versions();
    if header.api_version < min || header.api_version > max {
        return (
            Some(api),
            respond(
                &header,
                api_versions::unsupported(ErrorCode::UnsupportedVersion),
            ),
        );
    }
    let result = match api {
        ApiKey::ApiVersions => Ok(api_versions::handle(shard)),
        ApiKey::Metadata => metadata::handle(shard, request.body),
        ApiKey::ListTopics => admin::list_topics(shard),
        ApiKey::Produce => produce::handle(shard, request.body, frame, request.payload).await,
        ApiKey::Fetch => fetch::handle(shard, request.body).await,
        // A request's future is as large as the largest handler's and is
        // copied whole when its task is spawned: the rest run boxed, so
        // produce and fetch stay small.
        api => Box::pin(handle_rare(shard, api, request.body, peer)).await,
    };
    let outcome = match result {
        Ok(Reply::Body { body, payload }) => {
            let mut head = Vec::with_capacity(body.len() + 12);
            encode_response(&mut head, header.correlation_id, &body, &[]);
            let payload_len: usize = payload.iter().map(Bytes::len).sum();
            // encode_response wrote a length covering only the body: extend it over the payload.
            let len =
                u32::from_be_bytes(head[0..4].try_into().expect("prefix")) as usize + payload_len;
            head[0..4].copy_from_slice(&(len as u32).to_be_bytes());
            Outcome::Respond { head, payload }
        }
        Ok(Reply::None) => Outcome::NoResponse,
        Err(reason) => Outcome::Close(format!("{} request: {reason}", api.name())),
    };
    (Some(api), outcome)
}

/// The handlers off the produce and fetch paths, for `handle`.
async fn handle_rare(
    shard: &Rc<Shard>,
    api: ApiKey,
    body: &[u8],
    peer: SocketAddr,
) -> HandlerResult {
    match api {
        ApiKey::CreateTopics => admin::create_topics(shard, body).await,
        ApiKey::DeleteTopics => admin::delete_topics(shard, body).await,
        ApiKey::AlterTopicConfigs => admin::alter_topic_configs(shard, body).await,
        ApiKey::DescribeTopic => admin::describe_topic(shard, body).await,
        ApiKey::ListOffsets => list_offsets::handle(shard, body).await,
        ApiKey::FindCoordinator => coordinators::find_coordinator(shard, body).await,
        ApiKey::GroupHeartbeat => groups::heartbeat(shard, body, peer).await,
        ApiKey::OffsetCommit => groups::offset_commit(shard, body).await,
        ApiKey::OffsetFetch => groups::offset_fetch(shard, body).await,
        ApiKey::ListGroups => groups::list_groups(shard).await,
        ApiKey::DescribeGroup => groups::describe_group(shard, body).await,
        ApiKey::DeleteGroup => groups::delete_group(shard, body).await,
        ApiKey::DeleteGroupOffsets => groups::delete_group_offsets(shard, body).await,
        ApiKey::InitProducerId => producers::init_producer_id(shard, body).await,
        ApiKey::WriteTxnMarkers => transactions::write_txn_markers(shard, body).await,
        ApiKey::AddPartitionsToTxn => txn_coordinator::add_partitions(shard, body).await,
        ApiKey::EndTxn => txn_coordinator::end_txn(shard, body).await,
        ApiKey::ListTransactions => txn_coordinator::list(shard, body).await,
        ApiKey::DescribeTransaction => txn_coordinator::describe(shard, body).await,
        ApiKey::AddOffsetsToTxn => txn_coordinator::add_offsets(shard, body).await,
        ApiKey::TxnOffsetCommit => groups::txn_offset_commit(shard, body).await,
        ApiKey::ApiVersions
        | ApiKey::Metadata
        | ApiKey::ListTopics
        | ApiKey::Produce
        | ApiKey::Fetch => unreachable!("served by handle"),
    }
}

fn respond(header: &RequestHeader, body: Vec<u8>) -> Outcome {
    let mut head = Vec::new();
    encode_response(&mut head, header.correlation_id, &body, &[]);
    Outcome::Respond {
        head,
        payload: Vec::new(),
    }
}

/// Verifies and decodes a request body of type `T`.
pub(crate) fn parse<'a, T>(body: &'a [u8]) -> Result<T::Inner, String>
where
    T: Follow<'a> + Verifiable + 'a,
{
    protocol::flatbuffers::root::<T>(body).map_err(|e| format!("body does not verify: {e}"))
}

/// Finishes a builder into owned body bytes.
pub(crate) fn finish<T>(
    mut fbb: FlatBufferBuilder<'_>,
    root: protocol::flatbuffers::WIPOffset<T>,
) -> Vec<u8> {
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}
