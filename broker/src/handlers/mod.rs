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
    // A request's future is as large as the largest handler's and is copied
    // whole when its task is spawned: handlers off the produce and fetch
    // paths run boxed, so those two stay small.
    let result = match api {
        ApiKey::ApiVersions => Ok(api_versions::handle(shard)),
        ApiKey::Metadata => metadata::handle(shard, request.body),
        ApiKey::CreateTopics => Box::pin(admin::create_topics(shard, request.body)).await,
        ApiKey::DeleteTopics => Box::pin(admin::delete_topics(shard, request.body)).await,
        ApiKey::AlterTopicConfigs => {
            Box::pin(admin::alter_topic_configs(shard, request.body)).await
        }
        ApiKey::ListTopics => admin::list_topics(shard),
        ApiKey::DescribeTopic => Box::pin(admin::describe_topic(shard, request.body)).await,
        ApiKey::Produce => produce::handle(shard, request.body, frame, request.payload).await,
        ApiKey::Fetch => fetch::handle(shard, request.body).await,
        ApiKey::ListOffsets => Box::pin(list_offsets::handle(shard, request.body)).await,
        ApiKey::FindCoordinator => {
            Box::pin(coordinators::find_coordinator(shard, request.body)).await
        }
        ApiKey::GroupHeartbeat => Box::pin(groups::heartbeat(shard, request.body, peer)).await,
        ApiKey::OffsetCommit => Box::pin(groups::offset_commit(shard, request.body)).await,
        ApiKey::OffsetFetch => Box::pin(groups::offset_fetch(shard, request.body)).await,
        ApiKey::ListGroups => Box::pin(groups::list_groups(shard)).await,
        ApiKey::DescribeGroup => Box::pin(groups::describe_group(shard, request.body)).await,
        ApiKey::DeleteGroup => Box::pin(groups::delete_group(shard, request.body)).await,
        ApiKey::DeleteGroupOffsets => {
            Box::pin(groups::delete_group_offsets(shard, request.body)).await
        }
        ApiKey::InitProducerId => Box::pin(producers::init_producer_id(shard, request.body)).await,
        ApiKey::WriteTxnMarkers => {
            Box::pin(transactions::write_txn_markers(shard, request.body)).await
        }
        ApiKey::AddPartitionsToTxn => {
            Box::pin(txn_coordinator::add_partitions(shard, request.body)).await
        }
        ApiKey::EndTxn => Box::pin(txn_coordinator::end_txn(shard, request.body)).await,
        ApiKey::ListTransactions => Box::pin(txn_coordinator::list(shard, request.body)).await,
        ApiKey::DescribeTransaction => {
            Box::pin(txn_coordinator::describe(shard, request.body)).await
        }
        ApiKey::AddOffsetsToTxn => {
            Box::pin(txn_coordinator::add_offsets(shard, request.body)).await
        }
        ApiKey::TxnOffsetCommit => Box::pin(groups::txn_offset_commit(shard, request.body)).await,
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
