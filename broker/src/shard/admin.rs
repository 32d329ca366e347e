//! Topic admin on shard 0: checks what it can, forwards to the controller,
//! and answers once this broker's own metadata shows the change.

use std::rc::Rc;
use std::time::Duration;

use super::{
    controller_link, OpError, Shard, TopicOutcome, METADATA_SHARD, TOPIC_PROPAGATION_MS_MAX,
};
use crate::cluster_view::{topic_log_config, ClusterView, TopicSpec, TOPIC_CONFIGS_MAX};
use crate::runtime;
use protocol::control::messages::AlterTopicConfigSpec;
use protocol::ErrorCode;

use crate::group::OFFSETS_TOPIC;

impl Shard {
    /// Shard 0 only: checks what it can, forwards the rest to the controller,
    /// then waits until this broker's metadata shows each created topic.
    /// Topics named `__consumer_offsets` are refused: the broker creates it.
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
                if spec.name == OFFSETS_TOPIC && !internal {
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
            self.await_view(|view| created.iter().all(|name| view.topic(name).is_some()))
                .await;
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
            |name| (name == OFFSETS_TOPIC).then(|| internal_topic_refused(name)),
        );
        if names.is_empty() {
            return outcomes;
        }
        let forwarded = controller_link::forward_delete(self, &names).await;
        let deleted = merge_outcomes(&mut outcomes, forwarded);
        self.await_view(|view| deleted.iter().all(|name| view.topic(name).is_none()))
            .await;
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
                _ if spec.name == OFFSETS_TOPIC => Some(internal_topic_refused(&spec.name)),
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
            self.await_view(|view| {
                expected
                    .iter()
                    .all(|(name, config)| view.topic(name).is_some_and(|t| &t.config == config))
            })
            .await;
        }
        outcomes
    }

    /// Waits, bounded, until `done` holds for this shard's view and its
    /// replicas match that view. Shard 0 applies an update last, so then
    /// every shard has it.
    pub(super) async fn await_view(&self, done: impl Fn(&ClusterView) -> bool) {
        let deadline = self.clock.monotonic() + Duration::from_millis(TOPIC_PROPAGATION_MS_MAX);
        while self.clock.monotonic() < deadline {
            {
                let view = self.view.borrow();
                if done(&view) && self.reconciled_version.get() >= view.version.0 {
                    return;
                }
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

fn internal_topic_refused(name: &str) -> OpError {
    OpError::new(
        ErrorCode::PolicyViolation,
        format!("{name} is internal: the brokers create it, set its configs and never delete it"),
    )
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
