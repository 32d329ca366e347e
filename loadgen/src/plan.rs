//! Capacity planning: turns a workload (rate, message size, retention,
//! replication, disks, NICs, consumers) into bandwidths, retained bytes,
//! broker and partition counts, each with the formula that produced it.
//! Pure arithmetic in decimal units; it never touches the network or disk.

use serde::Serialize;
use thiserror::Error;

use crate::units::{
    format_bytes_decimal, format_bytes_per_s_decimal, format_duration_ms, format_thousands,
};

/// Bounds on plan inputs; beyond these the arithmetic stops meaning anything.
pub const RATE_MSGS_PER_S_MAX: u64 = 1_000_000_000;
pub const REPLICATION_FACTOR_MAX: u32 = 16;
pub const CONSUMER_GROUPS_MAX: u32 = 10_000;
pub const HEADROOM_FRACTION_MAX: f64 = 10.0;

/// Why plan inputs were rejected.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanError {
    #[error("--{flag}: must be at least {min}, got {value}")]
    TooSmall {
        flag: &'static str,
        min: f64,
        value: f64,
    },
    #[error("--{flag}: must be at most {max}, got {value}")]
    TooLarge {
        flag: &'static str,
        max: f64,
        value: f64,
    },
}

/// What the planner is asked about. All sizes in bytes, rates per second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanInput {
    pub rate_msgs_per_s: u64,
    pub message_size_bytes: u64,
    pub retention_ms: u64,
    pub replication_factor: u32,
    pub disk_per_broker_bytes: u64,
    /// Spare capacity on top of the exact need: 0.1 means 10 %.
    pub headroom_fraction: f64,
    pub consumer_groups: u32,
    /// Messages per second one consumer instance processes.
    pub per_consumer_rate_msgs_per_s: u64,
    /// One direction of a broker's NIC (full duplex), bytes per second.
    pub nic_bandwidth_bytes_per_s: f64,
}

impl PlanInput {
    /// The seed's Phase 2 workload: 1M msgs/s of 500 B, 7 days, RF 3, 20 TB disks.
    pub fn seed_example() -> PlanInput {
        PlanInput {
            rate_msgs_per_s: 1_000_000,
            message_size_bytes: 500,
            retention_ms: 7 * 86_400_000,
            replication_factor: 3,
            disk_per_broker_bytes: 20_000_000_000_000,
            headroom_fraction: 0.1,
            consumer_groups: 1,
            per_consumer_rate_msgs_per_s: 5_000,
            nic_bandwidth_bytes_per_s: 1.25e9,
        }
    }

    pub fn validate(&self) -> Result<(), PlanError> {
        check_range(
            "rate",
            self.rate_msgs_per_s as f64,
            1.0,
            RATE_MSGS_PER_S_MAX as f64,
        )?;
        check_range("message-size", self.message_size_bytes as f64, 1.0, 1e12)?;
        check_range("retention", self.retention_ms as f64, 1.0, 1e13)?;
        check_range(
            "replication-factor",
            f64::from(self.replication_factor),
            1.0,
            f64::from(REPLICATION_FACTOR_MAX),
        )?;
        check_range(
            "disk-per-broker",
            self.disk_per_broker_bytes as f64,
            1.0,
            1e18,
        )?;
        check_range(
            "headroom",
            self.headroom_fraction,
            0.0,
            HEADROOM_FRACTION_MAX,
        )?;
        check_range(
            "consumer-groups",
            f64::from(self.consumer_groups),
            0.0,
            f64::from(CONSUMER_GROUPS_MAX),
        )?;
        check_range(
            "per-consumer-rate",
            self.per_consumer_rate_msgs_per_s as f64,
            1.0,
            RATE_MSGS_PER_S_MAX as f64,
        )?;
        check_range("nic-bandwidth", self.nic_bandwidth_bytes_per_s, 1.0, 1e15)?;
        Ok(())
    }
}

fn check_range(flag: &'static str, value: f64, min: f64, max: f64) -> Result<(), PlanError> {
    if value.is_nan() || value < min {
        return Err(PlanError::TooSmall { flag, min, value });
    }
    if value > max {
        return Err(PlanError::TooLarge { flag, max, value });
    }
    Ok(())
}

/// The computed plan. Field names carry units; all bytes are decimal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub input: PlanInput,
    pub inbound_bytes_per_s: f64,
    /// Every replica writes every byte: inbound × RF.
    pub replicated_write_bytes_per_s: f64,
    /// Followers fetching from leaders: inbound × (RF − 1).
    pub replication_fetch_bytes_per_s: f64,
    /// Consumer groups each read everything: groups × inbound.
    pub consumer_read_bytes_per_s: f64,
    /// Leaving brokers: consumer reads + replication fetch.
    pub outbound_bytes_per_s: f64,
    /// Entering brokers: producer writes + replication fetch (= inbound × RF).
    pub broker_receive_bytes_per_s: f64,
    pub retained_bytes: f64,
    pub retained_replicated_bytes: f64,
    pub brokers_by_storage_exact: f64,
    pub brokers_by_storage: u64,
    pub brokers_by_bandwidth_exact: f64,
    pub brokers_by_bandwidth: u64,
    /// max(exact storage need, exact bandwidth need, RF) × (1 + headroom), rounded up once.
    pub brokers_with_headroom: u64,
    pub per_broker_write_bytes_per_s: f64,
    pub per_broker_read_bytes_per_s: f64,
    pub per_broker_nic_utilization_fraction: f64,
    pub disk_fill_at_retention_fraction: f64,
    pub partitions_for_consumer_parallelism: u64,
}

impl Plan {
    /// Computes the plan. Headroom is applied to the exact need and rounded
    /// up once: rounding before and after would count the spare twice
    /// (seed: ceil(45.36 × 1.1) = 50, where ceil(46 × 1.1) would be 51).
    pub fn compute(input: &PlanInput) -> Result<Plan, PlanError> {
        input.validate()?;
        let rf = f64::from(input.replication_factor);
        let inbound_bytes_per_s = input.rate_msgs_per_s as f64 * input.message_size_bytes as f64;
        let replicated_write_bytes_per_s = inbound_bytes_per_s * rf;
        let replication_fetch_bytes_per_s = inbound_bytes_per_s * (rf - 1.0);
        let consumer_read_bytes_per_s = inbound_bytes_per_s * f64::from(input.consumer_groups);
        let outbound_bytes_per_s = consumer_read_bytes_per_s + replication_fetch_bytes_per_s;
        let broker_receive_bytes_per_s = inbound_bytes_per_s + replication_fetch_bytes_per_s;
        let retention_s = input.retention_ms as f64 / 1e3;
        let retained_bytes = inbound_bytes_per_s * retention_s;
        let retained_replicated_bytes = retained_bytes * rf;
        let brokers_by_storage_exact =
            retained_replicated_bytes / input.disk_per_broker_bytes as f64;
        let nic_busiest_direction_bytes_per_s =
            broker_receive_bytes_per_s.max(outbound_bytes_per_s);
        let brokers_by_bandwidth_exact =
            nic_busiest_direction_bytes_per_s / input.nic_bandwidth_bytes_per_s;
        let need_exact = brokers_by_storage_exact
            .max(brokers_by_bandwidth_exact)
            .max(rf);
        let brokers_with_headroom = ceil_count(need_exact * (1.0 + input.headroom_fraction));
        let brokers = brokers_with_headroom as f64;
        let per_consumer = input.per_consumer_rate_msgs_per_s;
        let plan = Plan {
            input: input.clone(),
            inbound_bytes_per_s,
            replicated_write_bytes_per_s,
            replication_fetch_bytes_per_s,
            consumer_read_bytes_per_s,
            outbound_bytes_per_s,
            broker_receive_bytes_per_s,
            retained_bytes,
            retained_replicated_bytes,
            brokers_by_storage_exact,
            brokers_by_storage: ceil_count(brokers_by_storage_exact),
            brokers_by_bandwidth_exact,
            brokers_by_bandwidth: ceil_count(brokers_by_bandwidth_exact),
            brokers_with_headroom,
            per_broker_write_bytes_per_s: replicated_write_bytes_per_s / brokers,
            per_broker_read_bytes_per_s: outbound_bytes_per_s / brokers,
            per_broker_nic_utilization_fraction: nic_busiest_direction_bytes_per_s
                / brokers
                / input.nic_bandwidth_bytes_per_s,
            disk_fill_at_retention_fraction: retained_replicated_bytes
                / (brokers * input.disk_per_broker_bytes as f64),
            partitions_for_consumer_parallelism: input.rate_msgs_per_s.div_ceil(per_consumer),
        };
        plan.check_invariants();
        Ok(plan)
    }

    fn check_invariants(&self) {
        // ceil_count forgives float noise of one part in 10^9.
        assert!(self.brokers_by_storage as f64 >= self.brokers_by_storage_exact * (1.0 - 1e-9));
        assert!(self.brokers_by_bandwidth as f64 >= self.brokers_by_bandwidth_exact * (1.0 - 1e-9));
        assert!(self.brokers_with_headroom >= self.brokers_by_storage);
        assert!(self.brokers_with_headroom >= self.brokers_by_bandwidth);
        assert!(self.brokers_with_headroom >= u64::from(self.input.replication_factor));
        assert!(self.disk_fill_at_retention_fraction <= 1.0 + 1e-9);
    }

    /// Human-readable plan: one line per figure with its formula and the
    /// numbers substituted, in decimal units (stated in the header).
    pub fn render_text(&self) -> String {
        let i = &self.input;
        let rf = i.replication_factor;
        let mut out = String::new();
        out.push_str("Ringlog capacity plan (decimal units: 1 KB = 10^3 B, 1 MB = 10^6 B, 1 GB = 10^9 B, 1 TB = 10^12 B)\n");
        out.push_str(&format!(
            "inputs: rate {} msg/s, message {} B, retention {} ({} s), RF {}, disk/broker {}, headroom {:.0}%, consumer groups {}, per-consumer {} msg/s, NIC {:.1} Gbps = {} per direction\n\n",
            format_thousands(i.rate_msgs_per_s),
            i.message_size_bytes,
            format_duration_ms(i.retention_ms),
            format_thousands(i.retention_ms / 1000),
            rf,
            format_bytes_decimal(i.disk_per_broker_bytes as f64),
            i.headroom_fraction * 100.0,
            i.consumer_groups,
            format_thousands(i.per_consumer_rate_msgs_per_s),
            i.nic_bandwidth_bytes_per_s * 8.0 / 1e9,
            format_bytes_per_s_decimal(i.nic_bandwidth_bytes_per_s),
        ));
        for line in self.lines() {
            out.push_str(&format!("{:<34} {:>14}   = {}\n", line.0, line.1, line.2));
        }
        out
    }

    /// (label, value, formula with numbers) for each printed figure.
    fn lines(&self) -> Vec<(&'static str, String, String)> {
        let i = &self.input;
        let rf = i.replication_factor;
        let bw = format_bytes_per_s_decimal;
        let inbound = bw(self.inbound_bytes_per_s);
        vec![
            (
                "inbound bandwidth",
                inbound.clone(),
                format!(
                    "rate × message size = {} msg/s × {} B",
                    format_thousands(i.rate_msgs_per_s),
                    i.message_size_bytes
                ),
            ),
            (
                "replicated write bandwidth",
                bw(self.replicated_write_bytes_per_s),
                format!("inbound × RF = {inbound} × {rf}"),
            ),
            (
                "replication fetch bandwidth",
                bw(self.replication_fetch_bytes_per_s),
                format!("inbound × (RF − 1) = {inbound} × {}", rf - 1),
            ),
            (
                "consumer read bandwidth",
                bw(self.consumer_read_bytes_per_s),
                format!(
                    "consumer groups × inbound = {} × {inbound}",
                    i.consumer_groups
                ),
            ),
            (
                "outbound bandwidth",
                bw(self.outbound_bytes_per_s),
                format!(
                    "consumer reads + replication fetch = {} + {}",
                    bw(self.consumer_read_bytes_per_s),
                    bw(self.replication_fetch_bytes_per_s)
                ),
            ),
            (
                "retained bytes (one copy)",
                format_bytes_decimal(self.retained_bytes),
                format!(
                    "inbound × retention = {inbound} × {} s",
                    format_thousands(i.retention_ms / 1000)
                ),
            ),
            (
                "retained bytes (all replicas)",
                format_bytes_decimal(self.retained_replicated_bytes),
                format!(
                    "retained × RF = {} × {rf}",
                    format_bytes_decimal(self.retained_bytes)
                ),
            ),
            (
                "brokers by storage",
                format!("{}", self.brokers_by_storage),
                format!(
                    "ceil(retained with replicas ÷ disk per broker) = ceil({} ÷ {} = {:.2})",
                    format_bytes_decimal(self.retained_replicated_bytes),
                    format_bytes_decimal(i.disk_per_broker_bytes as f64),
                    self.brokers_by_storage_exact
                ),
            ),
            (
                "brokers by bandwidth",
                format!("{}", self.brokers_by_bandwidth),
                format!(
                    "ceil(max(receive {}, send {}) ÷ NIC {} = {:.2})",
                    bw(self.broker_receive_bytes_per_s),
                    bw(self.outbound_bytes_per_s),
                    bw(i.nic_bandwidth_bytes_per_s),
                    self.brokers_by_bandwidth_exact
                ),
            ),
            (
                "brokers with headroom",
                format!("{}", self.brokers_with_headroom),
                format!(
                    "ceil(max({:.2}, {:.2}, RF {rf}) × (1 + {})) = ceil({:.2})",
                    self.brokers_by_storage_exact,
                    self.brokers_by_bandwidth_exact,
                    i.headroom_fraction,
                    self.brokers_by_storage_exact
                        .max(self.brokers_by_bandwidth_exact)
                        .max(f64::from(rf))
                        * (1.0 + i.headroom_fraction)
                ),
            ),
            (
                "per-broker write rate",
                bw(self.per_broker_write_bytes_per_s),
                format!(
                    "replicated writes ÷ brokers = {} ÷ {}",
                    bw(self.replicated_write_bytes_per_s),
                    self.brokers_with_headroom
                ),
            ),
            (
                "per-broker read rate",
                bw(self.per_broker_read_bytes_per_s),
                format!(
                    "outbound ÷ brokers = {} ÷ {}",
                    bw(self.outbound_bytes_per_s),
                    self.brokers_with_headroom
                ),
            ),
            (
                "per-broker NIC utilization",
                format!("{:.1}%", self.per_broker_nic_utilization_fraction * 100.0),
                format!(
                    "busiest direction ÷ brokers ÷ NIC = {} ÷ {} ÷ {}",
                    bw(self
                        .broker_receive_bytes_per_s
                        .max(self.outbound_bytes_per_s)),
                    self.brokers_with_headroom,
                    bw(i.nic_bandwidth_bytes_per_s)
                ),
            ),
            (
                "disk fill at full retention",
                format!("{:.1}%", self.disk_fill_at_retention_fraction * 100.0),
                format!(
                    "retained with replicas ÷ (brokers × disk) = {} ÷ ({} × {})",
                    format_bytes_decimal(self.retained_replicated_bytes),
                    self.brokers_with_headroom,
                    format_bytes_decimal(i.disk_per_broker_bytes as f64)
                ),
            ),
            (
                "partitions for consumer parallelism",
                format!("{}", self.partitions_for_consumer_parallelism),
                format!(
                    "ceil(rate ÷ per-consumer rate) = ceil({} ÷ {})",
                    format_thousands(i.rate_msgs_per_s),
                    format_thousands(i.per_consumer_rate_msgs_per_s)
                ),
            ),
        ]
    }
}

/// Rounds a non-negative count up, tolerating float noise just above an
/// integer (45.000000000001 must not become 46).
fn ceil_count(value: f64) -> u64 {
    assert!(value.is_finite() && value >= 0.0, "count {value}");
    let nearest = value.round();
    if nearest >= 1.0 && (value - nearest).abs() <= nearest * 1e-9 {
        return nearest as u64;
    }
    value.ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected.abs() * 1e-12
    }

    // The seed's Phase 2 estimate, figure by figure.
    #[test]
    fn seed_figures() {
        let plan = Plan::compute(&PlanInput::seed_example()).unwrap();
        assert!(close(plan.inbound_bytes_per_s, 500e6));
        assert!(close(plan.replicated_write_bytes_per_s, 1.5e9));
        assert!(close(plan.replication_fetch_bytes_per_s, 1.0e9));
        assert!(close(plan.consumer_read_bytes_per_s, 500e6));
        assert!(close(plan.outbound_bytes_per_s, 1.5e9));
        assert!(close(plan.retained_bytes, 302.4e12));
        assert!(close(plan.retained_replicated_bytes, 907.2e12));
        assert!(close(plan.brokers_by_storage_exact, 45.36));
        assert_eq!(plan.brokers_by_storage, 46);
        assert_eq!(plan.brokers_by_bandwidth, 2);
        assert_eq!(plan.brokers_with_headroom, 50);
        assert!(close(plan.per_broker_write_bytes_per_s, 30e6));
        assert!(close(plan.per_broker_read_bytes_per_s, 30e6));
        assert_eq!(plan.partitions_for_consumer_parallelism, 200);
    }

    // Three consumer groups (the seed's outbound example) read 1.5 GB/s between them.
    #[test]
    fn three_consumer_groups_read_three_times_inbound() {
        let input = PlanInput {
            consumer_groups: 3,
            ..PlanInput::seed_example()
        };
        let plan = Plan::compute(&input).unwrap();
        assert!(close(plan.consumer_read_bytes_per_s, 1.5e9));
        assert!(close(plan.outbound_bytes_per_s, 2.5e9));
    }

    // The printed plan shows the exact storage ratio and the ceiling, in decimal units.
    #[test]
    fn text_shows_formulas_ratio_and_ceiling() {
        let text = Plan::compute(&PlanInput::seed_example())
            .unwrap()
            .render_text();
        for needle in [
            "500.00 MB/s",
            "1.50 GB/s",
            "302.40 TB",
            "907.20 TB",
            "= 45.36)",
            "brokers by storage                             46",
            "brokers with headroom                          50",
            "30.00 MB/s",
            "decimal units",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }

    // JSON output carries every figure under a unit-suffixed name.
    #[test]
    fn json_has_unit_suffixed_fields() {
        let plan = Plan::compute(&PlanInput::seed_example()).unwrap();
        let value = serde_json::to_value(&plan).unwrap();
        assert_eq!(value["brokers_by_storage"], 46);
        assert_eq!(value["brokers_with_headroom"], 50);
        assert_eq!(value["input"]["message_size_bytes"], 500);
        assert!((value["brokers_by_storage_exact"].as_f64().unwrap() - 45.36).abs() < 1e-9);
    }

    // A bandwidth-bound workload (tiny retention) is sized by NICs, never below RF.
    #[test]
    fn bandwidth_and_replication_floor() {
        let input = PlanInput {
            retention_ms: 1_000,
            consumer_groups: 20,
            ..PlanInput::seed_example()
        };
        let plan = Plan::compute(&input).unwrap();
        // send side: 20 × 0.5 + 1.0 = 11 GB/s over 1.25 GB/s NICs = 8.8 → 9.68 with headroom.
        assert_eq!(plan.brokers_by_bandwidth, 9);
        assert_eq!(plan.brokers_with_headroom, 10);
        let tiny = PlanInput {
            rate_msgs_per_s: 1,
            retention_ms: 1_000,
            headroom_fraction: 0.0,
            ..PlanInput::seed_example()
        };
        assert_eq!(Plan::compute(&tiny).unwrap().brokers_with_headroom, 3);
    }

    // Bad inputs name the flag.
    #[test]
    fn rejects_out_of_range_inputs() {
        let input = PlanInput {
            replication_factor: 0,
            ..PlanInput::seed_example()
        };
        let error = Plan::compute(&input).unwrap_err();
        assert!(error.to_string().contains("--replication-factor"));
        assert_eq!(ceil_count(45.000_000_000_001), 45);
        assert_eq!(ceil_count(45.36), 46);
        assert_eq!(ceil_count(7.5e-11), 1);
        assert_eq!(ceil_count(0.0), 0);
    }
}
