//! Proves that no byte string makes a decoder of the controller API panic:
//! every request and response body of every API behind
//! `protocol::control::codec::ControllerApi`, under the flatbuffers verifier
//! and the codec's own count bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    protocol::control::codec::decode_with_every_api(data);
});
