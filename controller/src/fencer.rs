//! The leader's session timer: every tick, if this controller leads and some
//! unfenced broker's session deadline has passed, proposes `FenceExpiredBrokers`
//! with the current time. The state machine decides who is fenced and who takes
//! over their partitions; this loop only reads the clock and proposes.
//!
//! A controller that has just become leader waits one session timeout before
//! fencing anyone: heartbeats sent during the election were refused, and
//! fencing brokers for the controller's own failover would move leadership of
//! every partition for nothing.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::command::{Command, Outcome};
use crate::service::{wall_clock_ms, ControllerService};

/// How often the leader looks for expired sessions.
pub const FENCE_CHECK_INTERVAL_MS: u64 = 100;

/// Runs until `shutdown` changes.
pub async fn run(service: ControllerService, mut shutdown: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(FENCE_CHECK_INTERVAL_MS));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let grace = Duration::from_millis(service.session_timeout_ms());
    // The term in which this node became leader, and when it noticed.
    let mut leading_since: Option<(u64, Instant)> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        if !service.is_leader() {
            leading_since = None;
            continue;
        }
        let term = service.raft().metrics().borrow().current_term;
        let since = match leading_since {
            Some((t, since)) if t == term => since,
            _ => {
                leading_since = Some((term, Instant::now()));
                continue;
            }
        };
        if since.elapsed() < grace {
            continue;
        }
        fence_expired(&service).await;
    }
}

async fn fence_expired(service: &ControllerService) {
    let now_ms = wall_clock_ms();
    let expired = service
        .state_machine()
        .with_state(|s| s.expired_brokers(now_ms));
    if expired.is_empty() {
        return;
    }
    match service
        .propose(Command::FenceExpiredBrokers { now_ms })
        .await
    {
        Ok(Outcome::BrokersFenced { broker_ids }) => {
            tracing::warn!(?broker_ids, "fenced brokers whose session expired");
        }
        Ok(other) => panic!("FenceExpiredBrokers applied with outcome {other:?}"),
        Err(error) => tracing::info!(%error, "fencing expired brokers failed; will retry"),
    }
}
