//! Writes a run's report directory: `result.json`, one `.hgrm` per
//! histogram and `report.html`, the only place the report touches the file
//! system (rendering lives in `report` and `report_html`).

use std::path::{Path, PathBuf};

use crate::histograms::{LatencyKind, RunRecorder};
use crate::report::{
    render_hgrm, ReportError, TestResult, WorkloadParameters, HGRM_TICKS_PER_HALF_DISTANCE,
    HGRM_VALUE_SCALE_US_PER_MS,
};
use crate::report_html::render_html;

/// Writes result.json, one .hgrm per histogram and report.html into `dir`
/// (created if missing). Returns the written paths.
pub fn write_report_dir(
    dir: &Path,
    workload: &WorkloadParameters,
    recorder: &RunRecorder,
) -> Result<Vec<PathBuf>, ReportError> {
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReportError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let result = TestResult::build(workload, recorder);
    let mut files: Vec<(PathBuf, String)> = vec![(
        dir.join("result.json"),
        serde_json::to_string_pretty(&result)? + "\n",
    )];
    for kind in LatencyKind::ALL {
        files.push((
            dir.join(format!("{}.hgrm", kind.slug())),
            render_hgrm(
                recorder.aggregate().get(kind),
                HGRM_TICKS_PER_HALF_DISTANCE,
                HGRM_VALUE_SCALE_US_PER_MS,
            ),
        ));
    }
    files.push((dir.join("report.html"), render_html(&result)));
    let mut written = Vec::with_capacity(files.len());
    for (path, text) in files {
        std::fs::write(&path, text).map_err(io_error(&path))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{sample_recorder, sample_workload};

    // write_report_dir writes the five files.
    #[test]
    fn writes_report_files() {
        let dir = std::env::temp_dir().join(format!("loadgen-report-{}", std::process::id()));
        let written = write_report_dir(&dir, &sample_workload(), &sample_recorder()).unwrap();
        assert_eq!(written.len(), 5);
        for path in &written {
            assert!(
                std::fs::metadata(path).unwrap().len() > 0,
                "{}",
                path.display()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
