//! Producer ids this broker hands out: shard 0 holds the block the
//! controller allocated to this broker (through Raft, so no id is ever given
//! twice) and takes the next block when it runs out; the other shards ask
//! shard 0 over the mesh. Starting a producer thus costs a Raft round trip
//! once per block, not once per producer.

use std::cell::Cell;
use std::rc::Rc;

use protocol::{ErrorCode, ProducerId};

use super::{OpError, Shard, ShardOp, ShardReply, METADATA_SHARD};

/// What is left of the current block: `[next, end)`.
#[derive(Debug, Default)]
pub struct ProducerIdBlock {
    next: Cell<i64>,
    end: Cell<i64>,
}

impl ProducerIdBlock {
    fn take(&self) -> Option<ProducerId> {
        let next = self.next.get();
        (next < self.end.get()).then(|| {
            self.next.set(next + 1);
            ProducerId(next)
        })
    }
}

impl Shard {
    /// A producer id never given before, from any shard.
    pub async fn init_producer_id(self: &Rc<Self>) -> Result<ProducerId, OpError> {
        if self.id == METADATA_SHARD {
            return self.next_producer_id().await;
        }
        match self.call(METADATA_SHARD, ShardOp::NextProducerId).await {
            ShardReply::ProducerId(result) => result,
            other => Err(OpError::new(
                ErrorCode::Unknown,
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    /// On shard 0: the next id of the block, asking the controller for a
    /// new block when it is used up (one request at a time).
    pub(super) async fn next_producer_id(&self) -> Result<ProducerId, OpError> {
        assert_eq!(self.id, METADATA_SHARD, "shard 0 holds the producer ids");
        if let Some(id) = self.producer_ids.take() {
            return Ok(id);
        }
        let _gate = self.producer_id_gate.enter().await;
        // Another request may have fetched a block while this one waited.
        if let Some(id) = self.producer_ids.take() {
            return Ok(id);
        }
        let block = super::controller_link::allocate_producer_ids(self).await?;
        assert!(
            block.first >= self.producer_ids.end.get(),
            "the controller gave block {block:?} below one it gave before"
        );
        self.producer_ids.next.set(block.first);
        self.producer_ids
            .end
            .set(block.first + i64::from(block.count));
        tracing::info!(
            first = block.first,
            count = block.count,
            "took a block of producer ids"
        );
        Ok(self.producer_ids.take().expect("a fresh block has ids"))
    }
}
