//! Start-up replay of the shard journals under a data directory, before any
//! log opens: each log's chunk images written after its last fence go back
//! into its segment files, the files are synced, and every ring is then
//! marked empty, so the logs' own recovery sees what was acknowledged and a
//! later crash never replays records older than this start.
//!
//! Blocking std I/O: it runs once, before the shards start. A ring with
//! nothing live (a clean shutdown emptied it) is read only as far as its
//! header and first record's blocks.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::checkpoint::{sync_dir, CLEAN_SHUTDOWN_FILE};
use super::journal::{
    may_start_record, record_candidates, replay_plan, scan, JournalError, JournalHeader,
    RecordBody, RingWriter, JOURNAL_BLOCK_BYTES,
};
use super::segment::{segment_path, LOG_SUFFIX};
use super::shard_journal::JOURNAL_RING_BYTES_MAX;

/// Under the data directory: one ring file per shard.
pub const JOURNAL_DIR: &str = "journal";
pub const JOURNAL_SUFFIX: &str = "ring";

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("journal {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// A ring whose header no longer reads may hold acknowledged records
    /// that are nowhere else: the broker does not start over it.
    #[error("journal {path} is unreadable ({source}); move it aside only if its records are known to be in the segment files")]
    Corrupt { path: PathBuf, source: JournalError },
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    pub rings: usize,
    /// Records read back from the rings.
    pub records: usize,
    /// Chunk images written back into segment files.
    pub writes: usize,
    /// Chunk images whose segment file no longer exists: removed (a deleted
    /// log, a retention delete) after they were journaled. A segment file
    /// is created, and its directory synced, before anything is written to
    /// it, so a missing file was removed on purpose.
    pub skipped_missing: usize,
    /// The logs written into: their recovery must scan, whatever a clean
    /// shutdown recorded.
    pub logs: BTreeSet<String>,
    /// The segment files written into, each synced.
    pub files: Vec<PathBuf>,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> ReplayError + '_ {
    move |source| ReplayError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The ring files under `data_dir`, in name order.
pub fn ring_files(data_dir: &Path) -> Result<Vec<PathBuf>, ReplayError> {
    let dir = data_dir.join(JOURNAL_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(&dir)(e)),
    };
    let mut rings = Vec::new();
    for entry in entries {
        let path = entry.map_err(io_error(&dir))?.path();
        if path.extension().is_some_and(|e| e == JOURNAL_SUFFIX) {
            rings.push(path);
        }
    }
    rings.sort();
    Ok(rings)
}

/// A ring file as far as its scan needs it. After a clean shutdown (most
/// starts) nothing is live: then only the header block and the blocks where
/// the first record would begin are read, the rest left zero, instead of
/// the whole ring from disk (its writes bypassed the page cache). If any of
/// those blocks may hold a record start, the whole ring is read.
fn read_ring(path: &Path) -> io::Result<Vec<u8>> {
    let block = JOURNAL_BLOCK_BYTES as usize;
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    if !(JOURNAL_BLOCK_BYTES * 2..=JOURNAL_RING_BYTES_MAX).contains(&len) {
        return fs::read(path);
    }
    let read_block = |at: u64| -> io::Result<Option<Vec<u8>>> {
        let mut bytes = vec![0u8; block];
        match file.read_exact_at(&mut bytes, at) {
            Ok(()) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    };
    let Some(head) = read_block(0)? else {
        return fs::read(path);
    };
    let Ok(header) = JournalHeader::decode_block(&head) else {
        return fs::read(path);
    };
    // Zeroed lazily by the allocator: only the blocks copied in are touched.
    let mut ring = vec![0u8; len as usize];
    ring[..block].copy_from_slice(&head);
    for candidate in record_candidates(header.start.position) {
        if candidate + JOURNAL_BLOCK_BYTES > len {
            continue;
        }
        match read_block(candidate)? {
            Some(bytes) if !may_start_record(&bytes) => {
                let at = candidate as usize;
                ring[at..at + block].copy_from_slice(&bytes);
            }
            _ => return fs::read(path),
        }
    }
    Ok(ring)
}

/// Replays every ring under `data_dir` into the segment files under
/// `data_dir/topics`, syncs what it wrote, then empties each ring.
pub fn replay_journals(data_dir: &Path) -> Result<ReplayReport, ReplayError> {
    let topics = data_dir.join("topics");
    let mut report = ReplayReport::default();
    for ring_path in ring_files(data_dir)? {
        let ring = read_ring(&ring_path).map_err(io_error(&ring_path))?;
        let found = scan(&ring).map_err(|source| ReplayError::Corrupt {
            path: ring_path.clone(),
            source,
        })?;
        report.rings += 1;
        report.records += found.records.len();
        // Each segment file opened once, synced once, whatever its records.
        let mut files: BTreeMap<PathBuf, File> = BTreeMap::new();
        let mut ring_logs: BTreeSet<&str> = BTreeSet::new();
        for record in replay_plan(&found.records) {
            let RecordBody::Write {
                segment_base,
                position,
                bytes,
            } = record.body
            else {
                unreachable!("a replay plan holds writes only");
            };
            let path = segment_path(&topics.join(record.log), segment_base, LOG_SUFFIX);
            let file = match files.entry(path.clone()) {
                Entry::Occupied(open) => open.into_mut(),
                Entry::Vacant(slot) => match OpenOptions::new().write(true).open(slot.key()) {
                    Ok(file) => slot.insert(file),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        report.skipped_missing += 1;
                        continue;
                    }
                    Err(e) => return Err(io_error(slot.key())(e)),
                },
            };
            file.write_all_at(bytes, position)
                .map_err(io_error(&path))?;
            report.writes += 1;
            ring_logs.insert(record.log);
        }
        for (path, file) in &files {
            file.sync_data().map_err(io_error(path))?;
        }
        report.files.extend(files.into_keys());
        // A log written into is rescanned at open, whatever its own clean
        // marker says; removed durably before the ring forgets the records.
        for log in &ring_logs {
            let dir = topics.join(log);
            match fs::remove_file(dir.join(CLEAN_SHUTDOWN_FILE)) {
                Ok(()) => sync_dir(&dir).map_err(io_error(&dir))?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&dir)(e)),
            }
        }
        report
            .logs
            .extend(ring_logs.iter().map(|log| (*log).to_owned()));
        // Only now may the ring forget them: its new header says nothing is
        // live, and the next round goes after what was just replayed.
        let (_, header_block) = RingWriter::resume(&found, crate::runtime::random_u64());
        let file = OpenOptions::new()
            .write(true)
            .open(&ring_path)
            .map_err(io_error(&ring_path))?;
        file.write_all_at(&header_block, 0)
            .and_then(|()| file.sync_data())
            .map_err(io_error(&ring_path))?;
    }
    if report.rings > 0 {
        let dir = data_dir.join(JOURNAL_DIR);
        sync_dir(&dir).map_err(io_error(&dir))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::super::journal::{JournalSeq, RecordSpec, JOURNAL_BLOCK_BYTES};
    use super::*;
    use protocol::Offset;

    const RING_BYTES: u64 = 64 * 1024;

    fn new_ring(data_dir: &Path, name: &str) -> (PathBuf, RingWriter) {
        let dir = data_dir.join(JOURNAL_DIR);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.{JOURNAL_SUFFIX}"));
        let writer = RingWriter::new(RING_BYTES, JournalSeq(1), 77).unwrap();
        let mut bytes = vec![0u8; RING_BYTES as usize];
        bytes[..JOURNAL_BLOCK_BYTES as usize].copy_from_slice(&writer.header().encode_block(None));
        fs::write(&path, bytes).unwrap();
        (path, writer)
    }

    fn write_round(path: &Path, writer: &mut RingWriter, records: &[RecordSpec<'_>]) {
        let round = writer.round(records).unwrap();
        let file = OpenOptions::new().write(true).open(path).unwrap();
        file.write_all_at(&round.bytes, round.position).unwrap();
    }

    fn segment(data_dir: &Path, log: &str, base: i64, len: usize) -> PathBuf {
        let dir = data_dir.join("topics").join(log);
        fs::create_dir_all(&dir).unwrap();
        let path = segment_path(&dir, Offset(base), LOG_SUFFIX);
        fs::write(&path, vec![0u8; len]).unwrap();
        path
    }

    #[test]
    fn chunks_after_each_logs_last_fence_go_back_into_their_segments_once() {
        let data = tempfile::tempdir().unwrap();
        let a = segment(data.path(), "t-0", 0, 4096);
        let b = segment(data.path(), "t-1", 500, 0);
        let (ring, mut writer) = new_ring(data.path(), "shard-0");
        let (one, two, three) = (vec![1u8; 4096], vec![2u8; 8192], vec![3u8; 4096]);
        write_round(
            &ring,
            &mut writer,
            &[
                RecordSpec::write("t-0", Offset(0), 0, &one),
                RecordSpec::write("t-1", Offset(500), 4096, &two),
            ],
        );
        write_round(
            &ring,
            &mut writer,
            &[
                RecordSpec::fence("t-0"),
                RecordSpec::write("t-0", Offset(0), 4096, &three),
                RecordSpec::write("gone-0", Offset(0), 0, &three),
            ],
        );

        let report = replay_journals(data.path()).unwrap();
        assert_eq!(
            report,
            ReplayReport {
                rings: 1,
                records: 5,
                writes: 2,
                skipped_missing: 1,
                logs: ["t-0".to_owned(), "t-1".to_owned()].into(),
                files: vec![a.clone(), b.clone()],
            }
        );
        // Fenced: t-0's first chunk is not written again.
        let mut want_a = vec![0u8; 4096];
        want_a.extend_from_slice(&three);
        assert_eq!(fs::read(&a).unwrap(), want_a);
        let mut want_b = vec![0u8; 4096];
        want_b.extend_from_slice(&two);
        assert_eq!(fs::read(&b).unwrap(), want_b);

        // Replayed records are never replayed again: the log may have been
        // truncated meanwhile.
        fs::write(&b, b"").unwrap();
        let again = replay_journals(data.path()).unwrap();
        assert_eq!(again.records, 0);
        assert!(fs::read(&b).unwrap().is_empty());

        // A ring resumed after replay takes new rounds that a scan finds.
        let bytes = fs::read(&ring).unwrap();
        let found = scan(&bytes).unwrap();
        let (mut resumed, header_block) = RingWriter::resume(&found, 78);
        let file = OpenOptions::new().write(true).open(&ring).unwrap();
        file.write_all_at(&header_block, 0).unwrap();
        write_round(
            &ring,
            &mut resumed,
            &[RecordSpec::write("t-1", Offset(500), 0, &one)],
        );
        let after = replay_journals(data.path()).unwrap();
        assert_eq!((after.records, after.writes), (1, 1));
        assert_eq!(fs::read(&b).unwrap(), one);
    }

    /// A ring read only at its header and first blocks scans as the whole
    /// file does: with live records (then it is read whole) and without.
    #[test]
    fn a_ring_read_in_part_scans_as_the_whole_file() {
        let data = tempfile::tempdir().unwrap();
        let (ring, mut writer) = new_ring(data.path(), "shard-0");
        let one = vec![1u8; 4096];
        write_round(
            &ring,
            &mut writer,
            &[RecordSpec::write("t-0", Offset(0), 0, &one)],
        );
        let count = |bytes: &[u8]| scan(bytes).unwrap().records.len();
        assert_eq!(count(&read_ring(&ring).unwrap()), 1);
        replay_journals(data.path()).unwrap();
        let (part, whole) = (read_ring(&ring).unwrap(), fs::read(&ring).unwrap());
        assert_eq!((count(&part), count(&whole)), (0, 0));
        assert_eq!(scan(&part).unwrap().next, scan(&whole).unwrap().next);
        assert_eq!(scan(&part).unwrap().header, scan(&whole).unwrap().header);
    }

    #[test]
    fn an_unreadable_ring_stops_the_start_with_its_name() {
        let data = tempfile::tempdir().unwrap();
        let (ring, _) = new_ring(data.path(), "shard-1");
        let file = OpenOptions::new().write(true).open(&ring).unwrap();
        file.write_all_at(&[0xff; 1024], 0).unwrap();
        let error = replay_journals(data.path()).unwrap_err();
        assert!(matches!(error, ReplayError::Corrupt { .. }), "{error}");
        assert!(error.to_string().contains("shard-1.ring"), "{error}");
    }

    #[test]
    fn no_journal_directory_is_nothing_to_replay() {
        let data = tempfile::tempdir().unwrap();
        assert_eq!(
            replay_journals(data.path()).unwrap(),
            ReplayReport::default()
        );
    }
}
