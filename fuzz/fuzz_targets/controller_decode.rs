//! Proves that no byte string makes a decoder of the controller API panic:
//! every request and response body of `protocol::control::codec`, under the
//! flatbuffers verifier and the codec's own count bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::control::codec::*;

fuzz_target!(|data: &[u8]| {
    let _ = decode_register_broker_request(data);
    let _ = decode_register_broker_response(data);
    let _ = decode_broker_heartbeat_request(data);
    let _ = decode_broker_heartbeat_response(data);
    let _ = decode_fetch_metadata_request(data);
    let _ = decode_fetch_metadata_response(data);
    let _ = decode_alter_isr_request(data);
    let _ = decode_alter_isr_response(data);
    let _ = decode_describe_cluster_request(data);
    let _ = decode_describe_cluster_response(data);
    let _ = decode_create_topics_request(data);
    let _ = decode_create_topics_response(data);
    let _ = decode_delete_topics_request(data);
    let _ = decode_delete_topics_response(data);
});
