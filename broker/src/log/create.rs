//! Making the directories of many new, empty partition logs at once, with a
//! handful of file system commits for the whole set instead of several per
//! log (a topic of thousands of partitions is created in one go).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use protocol::Offset;

use super::checkpoint::{create_dir_durably, sync_dir, SyncSet};
use super::segment::{segment_path, LOG_SUFFIX};

/// A new, empty log for `create_empty_logs`: its directory and the small
/// files it starts with besides its empty first segment.
#[derive(Clone, Debug)]
pub struct EmptyLog {
    pub dir: PathBuf,
    pub files: Vec<(&'static str, Vec<u8>)>,
}

/// Makes, under `parent`, the directory of each log in `logs` that does not
/// exist yet, with an empty first segment and the log's files, all durable
/// when this returns. Returns, for each log, whether it was made here (an
/// existing directory is left as it is, for the usual open to recover).
///
/// Until this returns nothing in the new directories is vouched for, so the
/// order in which a power loss would keep their entries and bytes does not
/// matter: whatever survives is a partial empty log, which an open recovers
/// (a missing or damaged file is made again) and which holds nothing ever
/// acknowledged. So every file is written first and all are synced together
/// (`SyncSet`: one `syncfs` when there are many), then each new directory
/// and the parent; on a journalling file system the first of those syncs
/// commits every new entry and the rest find nothing left to do.
pub fn create_empty_logs(parent: &Path, logs: &[EmptyLog]) -> io::Result<Vec<bool>> {
    create_dir_durably(parent)?;
    let mut written = SyncSet::new(parent)?;
    let mut made = Vec::with_capacity(logs.len());
    for log in logs {
        assert_eq!(
            log.dir.parent(),
            Some(parent),
            "a log directory under its parent"
        );
        match fs::create_dir(&log.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                made.push(false);
                continue;
            }
            Err(e) => return Err(e),
        }
        made.push(true);
        fs::File::create_new(segment_path(&log.dir, Offset::ZERO, LOG_SUFFIX))?;
        for (name, contents) in &log.files {
            let mut file = fs::File::create_new(log.dir.join(name))?;
            file.write_all(contents)?;
            written.add(file)?;
        }
    }
    if !made.contains(&true) {
        return Ok(made);
    }
    written.sync()?;
    for (log, &made) in logs.iter().zip(&made) {
        if made {
            sync_dir(&log.dir)?;
        }
    }
    sync_dir(parent)?;
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(parent: &Path, name: &str) -> EmptyLog {
        EmptyLog {
            dir: parent.join(name),
            files: vec![("topic.id", b"7".to_vec()), ("other", Vec::new())],
        }
    }

    #[test]
    fn new_directories_get_their_files_and_existing_ones_are_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("topics");
        std::fs::create_dir_all(parent.join("t-1")).unwrap();
        std::fs::write(parent.join("t-1").join("keep"), b"x").unwrap();
        let logs = [
            log(&parent, "t-0"),
            log(&parent, "t-1"),
            log(&parent, "t-2"),
        ];
        let _ = super::super::record_dir_syncs();
        let made = create_empty_logs(&parent, &logs).unwrap();
        let synced = super::super::record_dir_syncs();
        assert_eq!(made, vec![true, false, true]);
        for name in ["t-0", "t-2"] {
            let dir = parent.join(name);
            assert_eq!(std::fs::read(dir.join("topic.id")).unwrap(), b"7");
            assert_eq!(std::fs::read(dir.join("other")).unwrap(), b"");
            let segment = segment_path(&dir, Offset::ZERO, LOG_SUFFIX);
            assert_eq!(std::fs::metadata(segment).unwrap().len(), 0);
            assert!(synced.contains(&dir), "{name} synced");
        }
        assert!(synced.contains(&parent), "the parent synced");
        assert!(!synced.contains(&parent.join("t-1")));
        let kept: Vec<_> = std::fs::read_dir(parent.join("t-1"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(kept, vec![std::ffi::OsString::from("keep")]);
    }
}
