//! Writes a small seed corpus of valid encodings for the fuzz targets, so that
//! libFuzzer starts past the CRC, the zstd frame and the index magic instead of
//! having to discover them: `cargo run --example seed_corpus` (scripts/fuzz.sh
//! runs it when a target's corpus directory is missing or empty).

use std::fs;
use std::path::Path;

use broker::log::index::{OffsetEntry, OffsetIndex, TimeEntry, TimeIndex};
use broker::log::journal::{JournalSeq, RecordSpec, RingWriter};
use broker::log::producer_state::ProducerStateTable;
use broker::log::txn_index::{AbortedIndex, AbortedTxn};
use protocol::record_batch::{stamp, stamp_producer};
use protocol::{
    BatchBuilder, Compression, LeaderEpoch, Offset, ProducerEpoch, ProducerId, Record,
    RecordBatch, RecordHeader, Sequence,
};

fn batch(compression: Compression, records: &[Record<'_>], transactional: bool) -> Vec<u8> {
    let mut builder = BatchBuilder::new(compression)
        .producer(ProducerId(7), ProducerEpoch(1), Sequence(0))
        .transactional(transactional);
    for r in records {
        builder.push(r);
    }
    let mut bytes = builder.build().expect("seed batch builds");
    stamp(&mut bytes, Offset(42), LeaderEpoch(3));
    bytes
}

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");

    let headers = [
        RecordHeader {
            key: b"trace",
            value: Some(b"abc"),
        },
        RecordHeader {
            key: b"empty",
            value: None,
        },
    ];
    let one = [Record {
        timestamp_ms: 1_700_000_000_000,
        key: Some(b"k"),
        value: Some(b"v"),
        headers: &[],
    }];
    let many: Vec<Record<'_>> = (0..5)
        .map(|i| Record {
            timestamp_ms: 1_700_000_000_000 + i * 10,
            key: if i % 2 == 0 {
                Some(b"key".as_slice())
            } else {
                None
            },
            value: if i == 3 {
                None
            } else {
                Some(b"{\"event\":\"value\"}".as_slice())
            },
            headers: if i == 1 { &headers } else { &[] },
        })
        .collect();

    let mut seeds: Vec<(&str, Vec<u8>)> = vec![
        ("one-none", batch(Compression::None, &one, false)),
        ("many-none", batch(Compression::None, &many, false)),
        ("many-none-txn", batch(Compression::None, &many, true)),
        ("one-zstd", batch(Compression::Zstd, &one, false)),
        ("many-zstd", batch(Compression::Zstd, &many, false)),
    ];
    // Two batches back to back, as in a segment file: parse_prefix takes the first.
    let mut two = batch(Compression::None, &one, false);
    two.extend_from_slice(&batch(Compression::Zstd, &many, false));
    seeds.push(("two-batches", two));
    write(&root.join("record_batch"), &seeds)?;
    // The client's decoder takes a control byte first (0x04: fetch from offset 0).
    let fetched: Vec<(&str, Vec<u8>)> = seeds
        .iter()
        .map(|(name, bytes)| (*name, [&[0x04u8][..], bytes].concat()))
        .collect();
    write(&root.join("client_records"), &fetched)?;

    let mut offsets = OffsetIndex::default();
    let mut times = TimeIndex::default();
    for i in 0..6u32 {
        offsets.push(OffsetEntry {
            relative_offset: i * 100,
            position: i * 4096,
        });
        times.maybe_push(TimeEntry {
            timestamp_ms: 1_700_000_000_000 + i64::from(i) * 1000,
            relative_offset: i * 100,
        });
    }
    write(
        &root.join("index_decode"),
        &[
            ("offset-empty", OffsetIndex::default().encode()),
            ("offset-six", offsets.encode()),
            ("time-empty", TimeIndex::default().encode()),
            ("time-six", times.encode()),
        ],
    )?;

    // Producer snapshots: empty, and two producers with a few batches each.
    let mut producers = ProducerStateTable::new();
    for (i, header) in [one.as_slice(), many.as_slice(), one.as_slice()]
        .iter()
        .enumerate()
    {
        let mut bytes = batch(Compression::None, header, false);
        stamp_producer(
            &mut bytes,
            ProducerId(7 + (i as i64 % 2)),
            ProducerEpoch(1),
            Sequence(i as i32 * 5),
        );
        let parsed = RecordBatch::parse(&bytes, 1 << 20).expect("seed batch parses");
        producers.apply(parsed.header(), None);
    }
    write(
        &root.join("producer_snapshot"),
        &[
            (
                "empty",
                ProducerStateTable::new().encode_snapshot(Offset(0)),
            ),
            ("two-producers", producers.encode_snapshot(Offset(99))),
        ],
    )?;

    // Transaction indexes: empty, and two aborted transactions.
    let aborted = [
        AbortedTxn {
            producer_id: ProducerId(7),
            first_offset: Offset(3),
            last_offset: Offset(10),
        },
        AbortedTxn {
            producer_id: ProducerId(8),
            first_offset: Offset(5),
            last_offset: Offset(11),
        },
    ];
    write(
        &root.join("txn_index"),
        &[
            ("empty", AbortedIndex::encode_file(&[])),
            ("two-aborts", AbortedIndex::encode_file(&aborted)),
        ],
    )?;

    // Journal rounds, numbered from 0 as the target expects: a write and a
    // fence, then a second round of two logs.
    // The id must be the target's `FUZZ_RING_ID`.
    let mut ring = RingWriter::new(64 * 1024, JournalSeq(0), 0xf022).expect("ring size");
    let chunk = vec![7u8; 4096];
    let first = ring
        .round(&[
            RecordSpec::write("orders-0", Offset(0), 0, &chunk),
            RecordSpec::fence("orders-1"),
        ])
        .expect("round fits");
    let second = ring
        .round(&[RecordSpec::write("orders-1", Offset(100), 8192, &chunk)])
        .expect("round fits");
    let mut two_rounds = first.bytes.clone();
    two_rounds.extend_from_slice(&second.bytes);
    write(
        &root.join("journal_scan"),
        &[("one-round", first.bytes), ("two-rounds", two_rounds)],
    )
}

fn write(dir: &Path, seeds: &[(&str, Vec<u8>)]) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    for (name, bytes) in seeds {
        fs::write(dir.join(format!("seed-{name}")), bytes)?;
    }
    println!("wrote {} seeds to {}", seeds.len(), dir.display());
    Ok(())
}
