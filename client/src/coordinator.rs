//! `Coordinator`: finds a consumer group's (or a transactional id's)
//! coordinator (FindCoordinator, any broker) and sends its requests to it, finding it again and
//! retrying, with backoff and within a deadline, when the answer says it
//! moved (NOT_COORDINATOR), is loading (COORDINATOR_LOAD_IN_PROGRESS), is
//! not there yet (COORDINATOR_NOT_AVAILABLE) or the connection failed.
//! Every other answer goes back to the caller as it is: commits are never
//! retried on a member error.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::{ApiKey, ErrorCode};

use crate::cluster::Cluster;
use crate::error::{ClientError, Result};
use crate::group_types::CoordinatorInfo;
use crate::messages::{self, CoordinatorKey};

/// Bound on attempts of one call (lookups and requests together); the
/// deadline usually ends it first.
const COORDINATOR_ATTEMPTS_MAX: u32 = 64;

/// How a `Coordinator` retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First pause, doubled per attempt.
    pub backoff_ms: u64,
    pub backoff_ms_max: u64,
    /// Bound on one call, lookups and retries included.
    pub wait_ms_max: u64,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            backoff_ms: 100,
            backoff_ms_max: 1_000,
            wait_ms_max: 30_000,
        }
    }
}

impl RetryPolicy {
    /// Pause before attempt `attempt + 1` (`attempt` 1-based).
    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u64 << attempt.saturating_sub(1).min(20);
        Duration::from_millis(
            self.backoff_ms
                .saturating_mul(factor)
                .min(self.backoff_ms_max),
        )
    }
}

/// Whether an answer means "the coordinator is elsewhere or not ready":
/// find it again and retry.
pub fn must_find_again(error: &ClientError) -> bool {
    match error {
        ClientError::Broker { code, .. } => matches!(
            code,
            ErrorCode::NotCoordinator
                | ErrorCode::CoordinatorLoadInProgress
                | ErrorCode::CoordinatorNotAvailable
        ),
        other => other.is_connection_error(),
    }
}

/// One group's (or transactional id's) coordinator; cheap to clone (clones
/// share the cached address), so a heartbeat task can carry one.
#[derive(Clone, Debug)]
pub struct Coordinator {
    cluster: Cluster,
    /// The group id or transactional id.
    key: String,
    key_type: CoordinatorKey,
    policy: RetryPolicy,
    address: Arc<Mutex<Option<String>>>,
}

impl Coordinator {
    /// A consumer group's coordinator.
    pub fn new(cluster: Cluster, group_id: &str, policy: RetryPolicy) -> Coordinator {
        Coordinator {
            cluster,
            key: group_id.to_owned(),
            key_type: CoordinatorKey::Group,
            policy,
            address: Arc::new(Mutex::new(None)),
        }
    }

    /// A transactional id's coordinator.
    pub fn for_transaction(
        cluster: Cluster,
        transactional_id: &str,
        policy: RetryPolicy,
    ) -> Coordinator {
        Coordinator {
            key_type: CoordinatorKey::Transaction,
            ..Coordinator::new(cluster, transactional_id, policy)
        }
    }

    /// The group id (or transactional id) this coordinator serves.
    pub fn group_id(&self) -> &str {
        &self.key
    }

    /// Forgets the cached address: the next call looks the coordinator up.
    pub fn forget(&self) {
        *self.address.lock().expect("coordinator lock") = None;
    }

    fn cached(&self) -> Option<String> {
        self.address.lock().expect("coordinator lock").clone()
    }

    /// Asks any broker where the coordinator is, retrying while it is not
    /// available (its `__consumer_offsets` partition is being created or
    /// has no leader) or no broker answers, within the policy's wait.
    pub async fn find(&self) -> Result<CoordinatorInfo> {
        let deadline = Instant::now() + Duration::from_millis(self.policy.wait_ms_max);
        self.bounded(deadline, self.find_until(deadline)).await
    }

    async fn find_until(&self, deadline: Instant) -> Result<CoordinatorInfo> {
        let body = messages::find_coordinator_request(&self.key, self.key_type);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let answer = self
                .cluster
                .request_any(ApiKey::FindCoordinator, &body)
                .await
                .and_then(|response| messages::find_coordinator_response(response.body()));
            match answer {
                Ok(info) => {
                    *self.address.lock().expect("coordinator lock") = Some(info.address());
                    return Ok(info);
                }
                Err(error) if error.is_retriable() => {
                    self.pause(attempt, deadline, error).await?;
                    if error_needs_metadata(attempt) {
                        // The brokers may have changed since the bootstrap:
                        // a failed refresh is left to the next attempt.
                        let _ = self.cluster.refresh_metadata().await;
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Sleeps the backoff before the next attempt, or gives `error` back
    /// when the attempts or the deadline would run out.
    async fn pause(&self, attempt: u32, deadline: Instant, error: ClientError) -> Result<()> {
        let pause = self.policy.backoff(attempt);
        if attempt >= COORDINATOR_ATTEMPTS_MAX || Instant::now() + pause >= deadline {
            return Err(error);
        }
        tokio::time::sleep(pause).await;
        Ok(())
    }

    /// Sends one group request to the coordinator and decodes the answer,
    /// within the policy's wait.
    pub async fn call<T>(
        &self,
        api: ApiKey,
        body: &[u8],
        decode: impl Fn(&[u8]) -> Result<T>,
    ) -> Result<T> {
        self.call_within(
            api,
            body,
            decode,
            Duration::from_millis(self.policy.wait_ms_max),
        )
        .await
    }

    /// As `call`, bounded by `wait` instead (a heartbeat must not outlast
    /// the session it keeps).
    pub async fn call_within<T>(
        &self,
        api: ApiKey,
        body: &[u8],
        decode: impl Fn(&[u8]) -> Result<T>,
        wait: Duration,
    ) -> Result<T> {
        let deadline = Instant::now() + wait;
        self.bounded(deadline, self.call_until(api, body, &decode, deadline))
            .await
    }

    async fn call_until<T>(
        &self,
        api: ApiKey,
        body: &[u8],
        decode: &impl Fn(&[u8]) -> Result<T>,
        deadline: Instant,
    ) -> Result<T> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let address = match self.cached() {
                Some(address) => address,
                None => self.find_until(deadline).await?.address(),
            };
            let answer = self
                .cluster
                .request_to(&address, api, body, &[])
                .await
                .and_then(|response| decode(response.body()));
            match answer {
                Err(error) if must_find_again(&error) => {
                    self.forget();
                    self.pause(attempt, deadline, error).await?;
                }
                other => return other,
            }
        }
    }

    /// Runs `work` until `deadline`, turning a timeout into
    /// `ClientError::RequestTimeout` naming the group's coordinator.
    async fn bounded<T>(
        &self,
        deadline: Instant,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        match tokio::time::timeout_at(deadline.into(), work).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::RequestTimeout {
                address: match self.key_type {
                    CoordinatorKey::Group => format!("the coordinator of group `{}`", self.key),
                    CoordinatorKey::Transaction => {
                        format!("the coordinator of transactional id `{}`", self.key)
                    }
                },
                timeout_ms: u64::try_from(deadline.saturating_duration_since(started).as_millis())
                    .unwrap_or(u64::MAX),
            }),
        }
    }
}

/// Every fourth failed lookup refreshes the metadata, so a cluster whose
/// brokers all changed since the bootstrap is still found.
fn error_needs_metadata(attempt: u32) -> bool {
    attempt.is_multiple_of(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_errors_and_backoff() {
        // Proves which answers send the client to look the coordinator up
        // again (moved, loading, missing, connection lost) and which go back
        // to the caller untouched, and that the backoff doubles up to its
        // bound.
        for code in [
            ErrorCode::NotCoordinator,
            ErrorCode::CoordinatorLoadInProgress,
            ErrorCode::CoordinatorNotAvailable,
        ] {
            assert!(must_find_again(&ClientError::broker(code, None)));
        }
        assert!(must_find_again(&ClientError::ConnectionClosed {
            address: "a:1".into()
        }));
        for code in [
            ErrorCode::StaleMemberEpoch,
            ErrorCode::FencedMemberEpoch,
            ErrorCode::UnknownMemberId,
            ErrorCode::NonEmptyGroup,
        ] {
            assert!(!must_find_again(&ClientError::broker(code, None)));
        }
        let policy = RetryPolicy::default();
        let pauses: Vec<u64> = (1..=6)
            .map(|a| policy.backoff(a).as_millis() as u64)
            .collect();
        assert_eq!(pauses, vec![100, 200, 400, 800, 1_000, 1_000]);
    }
}
