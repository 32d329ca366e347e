//! Topic admin on shard 0: checks what it can, forwards to the controller,
//! and answers once this broker's own metadata shows the change.

use std::rc::Rc;
use std::time::Duration;

use super::{
    controller_link, is_internal_topic, OpError, Shard, TopicOutcome, METADATA_SHARD,
    TOPIC_PROPAGATION_MS_MAX,
};
use crate::cluster_view::{topic_log_config, ClusterView, TopicSpec, TOPIC_CONFIGS_MAX};
use crate::runtime;
use protocol::control::messages::AlterTopicConfigSpec;
use protocol::ErrorCode;

impl Shard {
    /// Shard 0 only: checks what it can, forwards the rest to the controller,
    /// then waits until this broker's metadata shows each created topic.
    /// Internal topics (`is_internal_topic`) are refused: the broker creates them.
    pub(super) async fn create_topics(self: &Rc<Self>, specs: Vec<TopicSpec>) -> Vec<TopicOutcome> {
        self.create_topics_checked(specs, false).await
    }

    pub(super) async fn create_topics_checked(
        self: &Rc<Self>,
        specs: Vec<TopicSpec>,
        internal: bool,
    ) -> Vec<TopicOutcome> {
        assert_eq!(self.id, METADATA_SHARD, "topic admin runs on shard 0");
        let _gate = self.admin_gate.enter().await;
        let (mut outcomes, valid) = check_each(
            specs,
            |s| &s.name,
            |spec| {
                if is_internal_topic(&spec.name) && !internal {
                    return Some(internal_topic_refused(&spec.name));
                }
                spec.validate(&self.config.log)
                    .err()
                    .map(|e| OpError::new(e.code, e.message))
            },
        );
        if !valid.is_empty() {
            let forwarded = controller_link::forward_create(self, &valid).await;
            let created = merge_outcomes(&mut outcomes, forwarded);
            let served = self
                .await_view(|view| created.iter().all(|name| view.topic(name).is_some()))
                .await;
            if !served {
                time_out(
                    &mut outcomes,
                    &created,
                    "created, but not yet served by every shard of this broker",
                );
            }
        }
        outcomes
    }

    /// Shard 0 only: forwards deletions, then waits until this broker's
    /// metadata no longer shows them.
    pub(super) async fn delete_topics(self: &Rc<Self>, names: Vec<String>) -> Vec<TopicOutcome> {
        assert_eq!(self.id, METADATA_SHARD, "topic admin runs on shard 0");
        let _gate = self.admin_gate.enter().await;
        let (mut outcomes, names) = check_each(
            names,
            |n| n,
            |name| is_internal_topic(name).then(|| internal_topic_refused(name)),
        );
        if names.is_empty() {
            return outcomes;
        }
        let forwarded = controller_link::forward_delete(self, &names).await;
        let deleted = merge_outcomes(&mut outcomes, forwarded);
        let removed = self
            .await_view(|view| deleted.iter().all(|name| view.topic(name).is_none()))
            .await;
        if !removed {
            time_out(
                &mut outcomes,
                &deleted,
                "deleted, but not yet removed from every shard of this broker",
            );
        }
        outcomes
    }

    /// Shard 0 only: checks that each topic exists and that its config after
    /// the change makes a valid log config here, forwards the valid ones, then
    /// waits until this broker's metadata shows the new configs.
    pub(super) async fn alter_topic_configs(
        self: &Rc<Self>,
        specs: Vec<AlterTopicConfigSpec>,
    ) -> Vec<TopicOutcome> {
        assert_eq!(self.id, METADATA_SHARD, "topic admin runs on shard 0");
        let _gate = self.admin_gate.enter().await;
        let mut expected = Vec::new();
        let (mut outcomes, valid) = check_each(
            specs,
            |s| &s.name,
            |spec| match self.view.borrow().topic(&spec.name) {
                _ if is_internal_topic(&spec.name) => Some(internal_topic_refused(&spec.name)),
                None => Some(OpError::new(
                    ErrorCode::UnknownTopicOrPartition,
                    format!("unknown topic {}", spec.name),
                )),
                Some(topic) => {
                    let mut config = topic.config.clone();
                    for key in &spec.remove {
                        config.remove(key);
                    }
                    config.extend(spec.set.clone());
                    let checked = if config.len() > TOPIC_CONFIGS_MAX {
                        Err(OpError::new(
                            ErrorCode::InvalidConfig,
                            "too many config entries",
                        ))
                    } else {
                        topic_log_config(&self.config.log, &config)
                            .map_err(|e| OpError::new(e.code, e.message))
                    };
                    match checked {
                        Ok(_) => {
                            expected.push((spec.name.clone(), config));
                            None
                        }
                        Err(e) => Some(e),
                    }
                }
            },
        );
        if !valid.is_empty() {
            let forwarded = controller_link::forward_alter_configs(self, &valid).await;
            let altered = merge_outcomes(&mut outcomes, forwarded);
            expected.retain(|(name, _)| altered.contains(name));
            let applied = self
                .await_view(|view| {
                    expected
                        .iter()
                        .all(|(name, config)| view.topic(name).is_some_and(|t| &t.config == config))
                })
                .await;
            if !applied {
                time_out(
                    &mut outcomes,
                    &altered,
                    "altered, but not yet applied by every shard of this broker",
                );
            }
        }
        outcomes
    }

    /// Shard 0: waits, bounded by `TOPIC_PROPAGATION_MS_MAX`, until `done`
    /// holds for the view and every shard has reconciled the first version
    /// that showed it; false when the bound passed first. Waiting on that
    /// first version, not on the latest, keeps later metadata updates (which
    /// shard 0 installs before the other shards apply them) from holding the
    /// answer back.
    pub(super) async fn await_view(&self, done: impl Fn(&ClusterView) -> bool) -> bool {
        let deadline = self.clock.monotonic() + Duration::from_millis(TOPIC_PROPAGATION_MS_MAX);
        let mut shown_at: Option<u64> = None;
        loop {
            if shown_at.is_none() {
                let view = self.view.borrow();
                if done(&view) {
                    shown_at = Some(view.version.0);
                }
            }
            if shown_at.is_some_and(|version| self.reconciled_version.get() >= version) {
                return true;
            }
            if self.clock.monotonic() >= deadline {
                return false;
            }
            runtime::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// One outcome per spec (failed where `check` says why), and the specs that
/// passed, to forward.
fn check_each<S: Clone>(
    specs: Vec<S>,
    name: impl Fn(&S) -> &String,
    mut check: impl FnMut(&S) -> Option<OpError>,
) -> (Vec<TopicOutcome>, Vec<S>) {
    let mut outcomes = Vec::with_capacity(specs.len());
    let mut valid = Vec::new();
    for spec in specs {
        let error = check(&spec);
        outcomes.push(TopicOutcome {
            name: name(&spec).clone(),
            error: error.clone(),
        });
        if error.is_none() {
            valid.push(spec);
        }
    }
    (outcomes, valid)
}

impl Shard {
    /// The spec an internal topic is created with: compacted, its
    /// replication factor capped by the live brokers, min.insync.replicas
    /// 2 once it has 3 replicas.
    pub(super) fn internal_topic_spec(
        &self,
        name: &str,
        partitions: u32,
        replication_factor: u16,
        segment_bytes: u64,
    ) -> TopicSpec {
        let live = self
            .view
            .borrow()
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .count()
            .max(1);
        let replication_factor = usize::from(replication_factor).min(live);
        let min_insync = if replication_factor >= 3 { 2 } else { 1 };
        TopicSpec {
            name: name.to_string(),
            partitions: i32::try_from(partitions).expect("bounded"),
            replication_factor: i16::try_from(replication_factor).expect("bounded"),
            configs: [
                ("cleanup.policy".to_string(), "compact".to_string()),
                ("segment.bytes".to_string(), segment_bytes.to_string()),
                (
                    crate::cluster_view::MIN_INSYNC_REPLICAS.to_string(),
                    min_insync.to_string(),
                ),
            ]
            .into(),
        }
    }

    /// Shard 0 only: creates an internal topic once (a concurrent creation
    /// by another broker answers TOPIC_ALREADY_EXISTS, which is fine).
    pub(super) async fn ensure_internal_topic(
        self: &Rc<Self>,
        spec: TopicSpec,
    ) -> Result<(), OpError> {
        assert_eq!(self.id, METADATA_SHARD, "topic admin runs on shard 0");
        if self.view.borrow().topic(&spec.name).is_some() {
            return Ok(());
        }
        let spec_name = spec.name.clone();
        let outcome = self.create_topics_checked(vec![spec], true).await;
        match outcome.into_iter().next().and_then(|o| o.error) {
            None => Ok(()),
            Some(e) if e.code == ErrorCode::TopicAlreadyExists => Ok(()),
            // The topic is on its way: clients retry a missing coordinator.
            Some(e) if e.code == ErrorCode::RequestTimedOut => Err(OpError::new(
                ErrorCode::CoordinatorNotAvailable,
                format!("{} is being created: {}", spec_name, e.message),
            )),
            Some(e) => Err(e),
        }
    }
}

fn internal_topic_refused(name: &str) -> OpError {
    OpError::new(
        ErrorCode::PolicyViolation,
        format!("{name} is internal: the brokers create it, set its configs and never delete it"),
    )
}

/// Answers REQUEST_TIMED_OUT for `names`, which the controller accepted but
/// this broker does not serve as changed yet: as Kafka's CreateTopics past
/// its timeout, the change still completes, and a retry or a metadata
/// request shows when.
fn time_out(outcomes: &mut [TopicOutcome], names: &[String], what: &str) {
    for outcome in outcomes.iter_mut().filter(|o| names.contains(&o.name)) {
        outcome.error = Some(OpError::new(
            ErrorCode::RequestTimedOut,
            format!("{what} after {TOPIC_PROPAGATION_MS_MAX} ms; the change goes on"),
        ));
    }
}

/// Puts the controller's answers for the forwarded topics into `outcomes`;
/// returns the names it accepted.
fn merge_outcomes(outcomes: &mut [TopicOutcome], forwarded: Vec<TopicOutcome>) -> Vec<String> {
    let accepted = forwarded
        .iter()
        .filter(|o| o.error.is_none())
        .map(|o| o.name.clone())
        .collect();
    for answer in forwarded {
        if let Some(slot) = outcomes
            .iter_mut()
            .find(|o| o.name == answer.name && o.error.is_none())
        {
            slot.error = answer.error;
        }
    }
    accepted
}
