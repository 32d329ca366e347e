//! AlterIsr: a leader asks to change a partition's in-sync replicas.

use super::*;

pub fn encode_alter_isr_request(request: &AlterIsr) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let isr: Vec<u32> = request.new_isr.iter().map(|b| b.0).collect();
    let new_isr = fbb.create_vector(&isr);
    let epochs: Vec<u64> = request.new_isr_epochs.iter().map(|e| e.0).collect();
    let new_isr_epochs = fbb.create_vector(&epochs);
    let root = wire::AlterIsrRequest::create(
        &mut fbb,
        &wire::AlterIsrRequestArgs {
            leader_id: request.leader_id.0,
            topic_id: request.topic_id.0,
            partition: request.partition.0,
            leader_epoch: request.leader_epoch.0,
            partition_epoch: request.partition_epoch.0,
            new_isr: Some(new_isr),
            new_isr_epochs: Some(new_isr_epochs),
        },
    );
    finish(fbb, root)
}

pub fn decode_alter_isr_request(body: &[u8]) -> Result<AlterIsr, WireError> {
    let r = flatbuffers::root::<wire::AlterIsrRequest>(body)?;
    let isr = r.new_isr().ok_or(WireError::Missing("new_isr"))?;
    bounded("new_isr", isr.len(), ISR_ENTRIES_MAX)?;
    let epochs: Vec<BrokerEpoch> = r
        .new_isr_epochs()
        .map(|e| e.iter().map(BrokerEpoch).collect())
        .unwrap_or_default();
    if !epochs.is_empty() && epochs.len() != isr.len() {
        return Err(WireError::OutOfRange {
            field: "new_isr_epochs",
            value: epochs.len() as i64,
        });
    }
    Ok(AlterIsr {
        leader_id: BrokerId(r.leader_id()),
        topic_id: TopicId(r.topic_id()),
        partition: PartitionIndex(r.partition()),
        leader_epoch: LeaderEpoch(r.leader_epoch()),
        partition_epoch: PartitionEpoch(r.partition_epoch()),
        new_isr: isr.iter().map(BrokerId).collect(),
        new_isr_epochs: epochs,
    })
}

pub fn encode_alter_isr_response(
    result: &Result<(PartitionIndex, PartitionRecord), ApiFailure>,
) -> Vec<u8> {
    let mut fbb = Fbb::new();
    let e = error_fields(&mut fbb, result);
    let partition = result
        .as_ref()
        .ok()
        .map(|(index, record)| encode_partition(&mut fbb, *index, record));
    let root = wire::AlterIsrResponse::create(
        &mut fbb,
        &wire::AlterIsrResponseArgs {
            error_code: e.code,
            error_message: e.message,
            leader_endpoint: e.leader_endpoint,
            partition,
        },
    );
    finish(fbb, root)
}

pub fn decode_alter_isr_response(
    body: &[u8],
) -> Result<Result<(PartitionIndex, PartitionRecord), ApiFailure>, WireError> {
    let r = flatbuffers::root::<wire::AlterIsrResponse>(body)?;
    if let Some(f) = failure(r.error_code(), r.error_message(), r.leader_endpoint()) {
        return Ok(Err(f));
    }
    Ok(Ok(decode_partition(r.partition())?))
}
