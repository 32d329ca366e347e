//! `Cluster`: the metadata cache and connection pool every client component
//! shares. Bootstraps from `HOST:PORT`, keeps one connection per endpoint
//! (a broker's main port or one of its shard ports) and routes a partition to
//! its leader's shard endpoint. Callers refresh it when an answer says the
//! cached view is stale (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
//! a failed connection).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use protocol::ApiKey;

use crate::config::ClientConfig;
use crate::connection::{Connection, Response};
use crate::error::{ClientError, Result};
use crate::messages;
use crate::metadata::{ClusterMetadata, TopicMetadata};

/// Bound on addresses in a bootstrap list.
const BOOTSTRAP_ADDRESSES_MAX: usize = 64;

struct Inner {
    config: ClientConfig,
    bootstrap: Vec<String>,
    metadata: RwLock<Arc<ClusterMetadata>>,
    /// One connection per endpoint address. A tokio mutex: connecting happens
    /// under it so that two callers never open two sockets to one endpoint.
    connections: tokio::sync::Mutex<HashMap<String, Connection>>,
    /// Serializes refreshes so a burst of errors costs one Metadata request.
    refresh: tokio::sync::Mutex<u64>,
}

/// Shared handle to the cluster view; cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("bootstrap", &self.inner.bootstrap)
            .finish()
    }
}

/// Splits `HOST:PORT[,HOST:PORT...]` and checks each part has a port.
pub fn parse_bootstrap(bootstrap: &str) -> Result<Vec<String>> {
    let addresses: Vec<String> = bootstrap
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if addresses.is_empty() || addresses.len() > BOOTSTRAP_ADDRESSES_MAX {
        return Err(ClientError::InvalidAddress(bootstrap.to_owned()));
    }
    for address in &addresses {
        let valid = address
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !valid {
            return Err(ClientError::InvalidAddress(address.clone()));
        }
    }
    Ok(addresses)
}

impl Cluster {
    /// Validates `config`, then fetches metadata from the bootstrap list.
    pub async fn connect(bootstrap: &str, config: ClientConfig) -> Result<Cluster> {
        config.validate()?;
        let cluster = Cluster {
            inner: Arc::new(Inner {
                config,
                bootstrap: parse_bootstrap(bootstrap)?,
                metadata: RwLock::new(Arc::new(ClusterMetadata::default())),
                connections: tokio::sync::Mutex::new(HashMap::new()),
                refresh: tokio::sync::Mutex::new(0),
            }),
        };
        cluster.refresh_metadata().await?;
        Ok(cluster)
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The cached metadata; never blocks on the network.
    pub fn metadata(&self) -> Arc<ClusterMetadata> {
        Arc::clone(&self.inner.metadata.read().expect("metadata lock"))
    }

    /// Fetches metadata for every topic, trying known brokers then the
    /// bootstrap list, up to `metadata_attempts_max` rounds.
    pub async fn refresh_metadata(&self) -> Result<Arc<ClusterMetadata>> {
        let mut refreshes = self.inner.refresh.lock().await;
        let body = messages::metadata_request(&[]);
        let mut last_error = None;
        for attempt in 0..self.inner.config.metadata_attempts_max {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(self.inner.config.metadata_backoff_ms))
                    .await;
            }
            for address in self.metadata_candidates() {
                let bound = Duration::from_millis(self.inner.config.metadata_timeout_ms);
                let answer = tokio::time::timeout(
                    bound,
                    self.request_to(&address, ApiKey::Metadata, &body, &[]),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::RequestTimeout {
                        address: address.clone(),
                        timeout_ms: self.inner.config.metadata_timeout_ms,
                    })
                });
                match answer {
                    Ok(response) => {
                        let metadata = Arc::new(messages::metadata_response(response.body())?);
                        *self.inner.metadata.write().expect("metadata lock") =
                            Arc::clone(&metadata);
                        *refreshes += 1;
                        return Ok(metadata);
                    }
                    Err(error) => last_error = Some(error),
                }
            }
        }
        Err(ClientError::NoBrokerAvailable(
            last_error.map_or_else(|| "no address".to_owned(), |e| e.to_string()),
        ))
    }

    /// Known brokers' main ports first (they reflect the current cluster),
    /// then the bootstrap addresses.
    fn metadata_candidates(&self) -> Vec<String> {
        let mut candidates: Vec<String> = self
            .metadata()
            .brokers
            .iter()
            .map(|b| b.address())
            .collect();
        for address in &self.inner.bootstrap {
            if !candidates.contains(address) {
                candidates.push(address.clone());
            }
        }
        candidates
    }

    /// The topic's metadata, refreshing up to `attempts_max` times while it is
    /// missing (a just-created topic). Partitions without a leader are left
    /// to the caller's retries: refreshing here on every call would turn one
    /// leaderless partition into a metadata request per record.
    pub async fn topic(&self, name: &str, attempts_max: u32) -> Result<TopicMetadata> {
        let ready =
            |m: &ClusterMetadata| m.topic(name).filter(|t| !t.partitions.is_empty()).cloned();
        if let Some(topic) = ready(&self.metadata()) {
            return Ok(topic);
        }
        for attempt in 0..attempts_max.max(1) {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(self.inner.config.metadata_backoff_ms))
                    .await;
            }
            if let Some(topic) = ready(&*self.refresh_metadata().await?) {
                return Ok(topic);
            }
        }
        self.metadata()
            .topic(name)
            .cloned()
            .ok_or_else(|| ClientError::UnknownTopic(name.to_owned()))
    }

    /// The pooled connection to `address`, reconnecting if the old one closed.
    pub async fn connection(&self, address: &str) -> Result<Connection> {
        let mut connections = self.inner.connections.lock().await;
        if let Some(existing) = connections.get(address) {
            if !existing.is_closed() {
                return Ok(existing.clone());
            }
            connections.remove(address);
        }
        let connection = Connection::connect(address, &self.inner.config).await?;
        connections.insert(address.to_owned(), connection.clone());
        Ok(connection)
    }

    /// The connection to a partition's leader shard, from cached metadata.
    pub async fn leader_connection(&self, topic: &str, partition: i32) -> Result<Connection> {
        let address = self.metadata().leader_address(topic, partition)?;
        self.connection(&address).await
    }

    /// Sends one request to `address` and waits for the response.
    pub async fn request_to(
        &self,
        address: &str,
        api: ApiKey,
        body: &[u8],
        payload: &[&[u8]],
    ) -> Result<Response> {
        self.connection(address)
            .await?
            .request(api, body, payload)
            .await
    }

    /// A new producer id and epoch from any broker (InitProducerId).
    pub async fn init_producer_id(
        &self,
    ) -> Result<(protocol::ProducerId, protocol::ProducerEpoch)> {
        let body = messages::init_producer_id_request(None);
        let response = self.request_any(ApiKey::InitProducerId, &body).await?;
        messages::init_producer_id_response(response.body())
    }

    /// Sends a request to any reachable broker (for admin requests, which
    /// any broker forwards to the controller).
    pub async fn request_any(&self, api: ApiKey, body: &[u8]) -> Result<Response> {
        let mut last_error = None;
        for address in self.metadata_candidates() {
            match self.request_to(&address, api, body, &[]).await {
                Ok(response) => return Ok(response),
                Err(error) if error.is_connection_error() => last_error = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(ClientError::NoBrokerAvailable(
            last_error.map_or_else(|| "no address".to_owned(), |e| e.to_string()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_lists_are_validated() {
        // Proves a bootstrap string is a comma list of HOST:PORT and that a
        // missing or bad port is refused before any connection is tried.
        assert_eq!(
            parse_bootstrap("a:1, b:2").unwrap(),
            vec!["a:1".to_owned(), "b:2".to_owned()]
        );
        assert!(parse_bootstrap("localhost").is_err());
        assert!(parse_bootstrap("a:99999").is_err());
        assert!(parse_bootstrap("").is_err());
    }
}
