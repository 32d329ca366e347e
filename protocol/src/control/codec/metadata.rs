//! FetchMetadata: the metadata long poll, answered with deltas or an image.

use super::*;

pub fn encode_fetch_metadata_request(request: &FetchMetadata) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let root = wire::FetchMetadataRequest::create(
        &mut fbb,
        &wire::FetchMetadataRequestArgs {
            from_version: request.from_version.0,
            max_wait_ms: request.max_wait_ms,
            full_image: request.full_image,
        },
    );
    finish(fbb, root)
}

pub fn decode_fetch_metadata_request(body: &[u8]) -> Result<FetchMetadata, WireError> {
    let r = flatbuffers::root::<wire::FetchMetadataRequest>(body)?;
    Ok(FetchMetadata {
        from_version: MetadataVersion(r.from_version()),
        max_wait_ms: r.max_wait_ms(),
        full_image: r.full_image(),
    })
}

pub fn encode_fetch_metadata_response(result: &Result<MetadataAnswer, ApiFailure>) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let e = error_fields(&mut fbb, result);
    let mut args = wire::FetchMetadataResponseArgs {
        error_code: e.code,
        error_message: e.message,
        leader_endpoint: e.leader_endpoint,
        ..Default::default()
    };
    match result {
        Ok(MetadataAnswer::Deltas {
            metadata_version,
            deltas,
        }) => {
            let deltas: Vec<_> = deltas.iter().map(|d| encode_delta(&mut fbb, d)).collect();
            args.deltas = Some(fbb.create_vector(&deltas));
            args.metadata_version = metadata_version.0;
        }
        Ok(MetadataAnswer::Image(image)) => {
            args.image = Some(encode_image(&mut fbb, image));
            args.metadata_version = image.metadata_version.0;
        }
        Err(_) => {}
    }
    let root = wire::FetchMetadataResponse::create(&mut fbb, &args);
    finish(fbb, root)
}

/// Large images are legitimate here, so the verifier's table bound is raised
/// from flatbuffers' default; the frame bound still limits the bytes.
fn verifier_options() -> flatbuffers::VerifierOptions {
    flatbuffers::VerifierOptions {
        max_tables: 100_000_000,
        ..Default::default()
    }
}

pub fn decode_fetch_metadata_response(
    body: &[u8],
) -> Result<Result<MetadataUpdate, ApiFailure>, WireError> {
    let r = flatbuffers::root_with_opts::<wire::FetchMetadataResponse>(&verifier_options(), body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    if let Some(image) = r.image() {
        return Ok(Ok(MetadataUpdate::Image(decode_image(image)?)));
    }
    let deltas = r
        .deltas()
        .iter()
        .flatten()
        .map(decode_delta)
        .collect::<Result<_, _>>()?;
    Ok(Ok(MetadataUpdate::Deltas {
        metadata_version: MetadataVersion(r.metadata_version()),
        deltas,
    }))
}
