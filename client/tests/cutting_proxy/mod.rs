//! A fault-injecting TCP proxy for tests: it listens on 127.0.0.2 at the
//! ports of brokers listening on 127.0.0.1 (which advertise 127.0.0.2, so
//! clients connect through it), relays requests as they come, and while
//! cutting is on it closes both sides instead of relaying every
//! `cut_every`-th response: the broker handled the request, the client
//! never learns how.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The host clients reach brokers through.
pub const PROXY_HOST: &str = "127.0.0.2";

#[derive(Debug)]
pub struct CuttingProxy {
    cutting: Arc<AtomicBool>,
    responses: Arc<AtomicU64>,
    cuts: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl CuttingProxy {
    /// Proxies `ports` (each PROXY_HOST:port to 127.0.0.1:port), relaying
    /// everything until `start_cutting`.
    pub async fn start(ports: &[u16], cut_every: u64) -> CuttingProxy {
        assert!(cut_every > 0);
        let cutting = Arc::new(AtomicBool::new(false));
        let responses = Arc::new(AtomicU64::new(0));
        let cuts = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for &port in ports {
            let listener = TcpListener::bind((PROXY_HOST, port))
                .await
                .unwrap_or_else(|e| panic!("binding {PROXY_HOST}:{port}: {e}"));
            let (cutting, responses, cuts) = (cutting.clone(), responses.clone(), cuts.clone());
            tasks.push(tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (cutting, responses, cuts) =
                        (cutting.clone(), responses.clone(), cuts.clone());
                    tokio::spawn(async move {
                        let Ok(broker) = TcpStream::connect(("127.0.0.1", port)).await else {
                            return;
                        };
                        relay(client, broker, cut_every, &cutting, &responses, &cuts).await;
                    });
                }
            }));
        }
        CuttingProxy {
            cutting,
            responses,
            cuts,
            tasks,
        }
    }

    /// Cuts every `cut_every`-th response from now on.
    pub fn start_cutting(&self) {
        self.cutting.store(true, Ordering::SeqCst);
    }

    /// Relays everything from now on.
    pub fn stop_cutting(&self) {
        self.cutting.store(false, Ordering::SeqCst);
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn relay(
    client: TcpStream,
    broker: TcpStream,
    cut_every: u64,
    cutting: &AtomicBool,
    responses: &AtomicU64,
    cuts: &AtomicU64,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut broker_read, mut broker_write) = broker.into_split();
    let requests = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut broker_write).await;
    });
    loop {
        let mut prefix = [0u8; 4];
        if broker_read.read_exact(&mut prefix).await.is_err() {
            break;
        }
        let len = u32::from_be_bytes(prefix) as usize;
        let mut frame = vec![0u8; len];
        if broker_read.read_exact(&mut frame).await.is_err() {
            break;
        }
        let count = responses.fetch_add(1, Ordering::SeqCst) + 1;
        if cutting.load(Ordering::SeqCst) && count.is_multiple_of(cut_every) {
            cuts.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if client_write.write_all(&prefix).await.is_err()
            || client_write.write_all(&frame).await.is_err()
        {
            break;
        }
    }
    // Dropping both halves closes both connections.
    requests.abort();
}
