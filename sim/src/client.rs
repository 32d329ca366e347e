//! Simulated clients: producers sending acks=0, 1 and all to whoever the
//! controller says leads, and one consumer per partition reading committed
//! records in order from the leader. They report what the cluster told them
//! to the checker; one request in flight each, bounded by a timeout.

use protocol::{BrokerId, ErrorCode};

use crate::msg::{Action, ClientTimer, Msg, Node, Observation, Timer};
use crate::rng::Rng;

const REQUEST_MS_MAX: u64 = 4_000;
const PRODUCE_PAUSE_MS_MAX: u64 = 20;
const CONSUME_POLL_MS: u64 = 15;
const VALUES_PER_PRODUCE_MAX: u64 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Producer,
    Consumer { partition: u32 },
}

#[derive(Clone, Debug)]
enum InFlight {
    Produce {
        partition: u32,
        acks: i16,
        values: Vec<u64>,
    },
    Consume,
    Metadata,
}

#[derive(Debug)]
pub struct Client {
    pub id: u32,
    pub role: Role,
    partitions: u32,
    leaders: Vec<Option<BrokerId>>,
    in_flight: Option<(u64, InFlight)>,
    next_request_id: u64,
    /// A consumer's next offset.
    pub position: i64,
    pub requests_sent: u64,
}

/// What a client step produced.
#[derive(Debug, Default)]
pub struct ClientOut {
    pub actions: Vec<Action>,
    pub observations: Vec<Observation>,
}

impl Client {
    pub fn new(id: u32, role: Role, partitions: u32) -> Client {
        Client {
            id,
            role,
            partitions,
            leaders: Vec::new(),
            in_flight: None,
            next_request_id: 0,
            position: 0,
            requests_sent: 0,
        }
    }

    fn send(&mut self, out: &mut ClientOut, to: Node, msg: Msg, what: InFlight) -> u64 {
        self.next_request_id += 1;
        let id = self.next_request_id;
        self.in_flight = Some((id, what));
        self.requests_sent += 1;
        out.actions.push(Action::Send { to, msg });
        out.actions.push(Action::After {
            delay_ms: REQUEST_MS_MAX,
            timer: Timer::Client(self.id, ClientTimer::Timeout { request_id: id }),
        });
        id
    }

    fn step_later(&self, out: &mut ClientOut, delay_ms: u64) {
        out.actions.push(Action::After {
            delay_ms,
            timer: Timer::Client(self.id, ClientTimer::Step),
        });
    }

    /// `next_value` hands out values no other record has.
    pub fn on_timer(
        &mut self,
        timer: ClientTimer,
        rng: &mut Rng,
        next_value: &mut u64,
        out: &mut ClientOut,
    ) {
        match timer {
            ClientTimer::Step => self.step(rng, next_value, out),
            ClientTimer::Timeout { request_id } => {
                if self
                    .in_flight
                    .as_ref()
                    .is_some_and(|(id, _)| *id == request_id)
                {
                    self.in_flight = None;
                    self.leaders.clear();
                    self.step_later(out, 1);
                }
            }
        }
    }

    fn step(&mut self, rng: &mut Rng, next_value: &mut u64, out: &mut ClientOut) {
        if self.in_flight.is_some() {
            return;
        }
        let partition = match self.role {
            Role::Producer => rng.between(0, u64::from(self.partitions) - 1) as u32,
            Role::Consumer { partition } => partition,
        };
        let leader = self.leaders.get(partition as usize).copied().flatten();
        let Some(leader) = leader else {
            self.send(
                out,
                Node::Controller,
                Msg::ClientMetadata,
                InFlight::Metadata,
            );
            return;
        };
        let to = Node::AnyBroker(leader);
        match self.role {
            Role::Producer => {
                let acks = rng.pick(&[-1i16, -1, -1, 1, 1, 0]);
                let count = rng.between(1, VALUES_PER_PRODUCE_MAX);
                let values: Vec<u64> = (0..count)
                    .map(|_| {
                        *next_value += 1;
                        *next_value
                    })
                    .collect();
                let request_id = self.next_request_id + 1;
                let msg = Msg::Produce {
                    request_id,
                    partition,
                    acks,
                    values: values.clone(),
                };
                self.send(
                    out,
                    to,
                    msg,
                    InFlight::Produce {
                        partition,
                        acks,
                        values,
                    },
                );
            }
            Role::Consumer { partition } => {
                let request_id = self.next_request_id + 1;
                let msg = Msg::Consume {
                    request_id,
                    partition,
                    offset: self.position,
                };
                self.send(out, to, msg, InFlight::Consume);
            }
        }
    }

    pub fn on_message(&mut self, rng: &mut Rng, msg: Msg, out: &mut ClientOut) {
        let answered = |request_id: u64, in_flight: &Option<(u64, InFlight)>| {
            in_flight.as_ref().is_some_and(|(id, _)| *id == request_id)
        };
        match msg {
            Msg::ClientMetadataAnswer { leaders } => {
                if matches!(self.in_flight, Some((_, InFlight::Metadata))) {
                    self.in_flight = None;
                    self.leaders = leaders;
                    let known = self.leaders.iter().any(Option::is_some);
                    self.step_later(out, if known { 0 } else { 50 });
                }
            }
            Msg::ProduceAnswer { request_id, result } => {
                if !answered(request_id, &self.in_flight) {
                    return;
                }
                let Some((
                    _,
                    InFlight::Produce {
                        partition,
                        acks,
                        values,
                    },
                )) = self.in_flight.take()
                else {
                    unreachable!("checked above")
                };
                match result {
                    Ok(base) => out.observations.push(Observation::Acked {
                        partition,
                        acks,
                        base,
                        values,
                    }),
                    Err(_) => self.leaders.clear(),
                }
                self.step_later(out, rng.between(0, PRODUCE_PAUSE_MS_MAX));
            }
            Msg::ConsumeAnswer {
                request_id,
                partition,
                result,
            } => {
                if !answered(request_id, &self.in_flight) {
                    return;
                }
                self.in_flight = None;
                match result {
                    Ok((offset, records)) if offset == self.position => {
                        self.position += records.len() as i64;
                        let delay = if records.is_empty() {
                            CONSUME_POLL_MS
                        } else {
                            0
                        };
                        if !records.is_empty() {
                            out.observations.push(Observation::Consumed {
                                partition,
                                offset,
                                records,
                            });
                        }
                        self.step_later(out, delay);
                    }
                    Ok(_) => self.step_later(out, 0),
                    Err(code) => {
                        if code == ErrorCode::OffsetOutOfRange {
                            out.observations.push(Observation::OutOfRange {
                                partition,
                                offset: self.position,
                            });
                        }
                        self.leaders.clear();
                        self.step_later(out, CONSUME_POLL_MS);
                    }
                }
            }
            other => panic!("client {} got an unexpected {other:?}", self.id),
        }
    }
}
