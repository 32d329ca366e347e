//! What the simulations share: batches whose records each name their batch's
//! tag and their index in it (so a reader can tell which write it got, and
//! whether it is whole), the journal of a run, and the failure of a seed.

use protocol::{BatchBuilder, Record, RecordBatch};

/// Pushes `count` records onto `builder`, each valued "{tag}:{index}:"
/// padded to `value_bytes`, and builds the batch.
pub fn build(
    mut builder: BatchBuilder,
    tag: u64,
    count: usize,
    value_bytes: usize,
    timestamp_ms: i64,
) -> Vec<u8> {
    for i in 0..count {
        let mut value = format!("{tag}:{i}:").into_bytes();
        value.resize(value_bytes.max(value.len()), b'x');
        builder.push(&Record {
            timestamp_ms: timestamp_ms + i as i64,
            key: Some(b"key"),
            value: Some(&value),
            headers: &[],
        });
    }
    builder.build().expect("batch builds")
}

/// The tag and record count of a batch built by `build`; an error if a
/// record names another tag or is out of its place.
pub fn read(batch: &RecordBatch<'_>) -> Result<(u64, usize), String> {
    let section = batch
        .records_section(1 << 26)
        .map_err(|e| format!("records: {e}"))?;
    let mut tag = None;
    let mut count = 0;
    for (i, record) in section.iter().enumerate() {
        let record = record.map_err(|e| format!("record: {e}"))?;
        let value = String::from_utf8_lossy(record.value.unwrap_or_default()).into_owned();
        let mut parts = value.splitn(3, ':');
        let t: u64 = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or(format!("record value {value:?}"))?;
        let index: usize = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or(format!("record value {value:?}"))?;
        if *tag.get_or_insert(t) != t || index != i {
            return Err(format!("batch mixes records: {value:?} at index {i}"));
        }
        count += 1;
    }
    Ok((tag.unwrap_or(u64::MAX), count))
}

/// What a batch held, as a checker remembers it: its tag (unique in the
/// seed) and its record count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub tag: u64,
    pub count: u32,
}

impl Sent {
    /// The batch's tag and count, checking each record names them.
    pub fn of(batch: &RecordBatch<'_>) -> Result<Sent, String> {
        let (tag, count) = read(batch)?;
        Ok(Sent {
            tag,
            count: count as u32,
        })
    }

    /// The offset after the batch, if it starts at `base`.
    pub fn end(&self, base: i64) -> i64 {
        base + self.count as i64
    }
}

/// A run's trace and the violations found in it.
#[derive(Debug, Default)]
pub struct Journal {
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    /// Print each line as it comes (`--trace`).
    pub print: bool,
}

impl Journal {
    pub fn note(&mut self, line: String) {
        if self.print {
            println!("{line}");
        }
        self.trace.push(line);
    }

    pub fn violation(&mut self, line: String) {
        self.note(format!("VIOLATION: {line}"));
        self.violations.push(line);
    }
}

/// A failing seed: what broke, the trace leading to it, and how to replay it.
#[derive(Debug)]
pub struct SeedFailure {
    /// The `ringlog-sim` mode flag that replays it ("storage", "shard").
    pub mode: &'static str,
    pub seed: u64,
    /// Options the run had beyond the mode's defaults, as `ringlog-sim`
    /// flags, so the replay runs the same thing.
    pub options: String,
    pub violation: String,
    pub trace: Vec<String>,
}

/// Trace lines a failure prints (the replay prints them all).
const TRACE_TAIL_LINES: usize = 60;

impl std::fmt::Display for SeedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} seed {} failed: {}",
            self.mode, self.seed, self.violation
        )?;
        let from = self.trace.len().saturating_sub(TRACE_TAIL_LINES);
        for line in &self.trace[from..] {
            writeln!(f, "  {line}")?;
        }
        write!(
            f,
            "replay: cargo run --release -p sim --bin ringlog-sim -- --{} --seed {}{} --trace",
            self.mode, self.seed, self.options
        )
    }
}
