//! `blindfold verify`: checks every stored cell against the trusted versions and the directory
//! against the allocator.

use crate::server::Opened;
use crate::Result;

/// What verification found.
#[derive(Debug, Default)]
pub struct Report {
    /// Buckets in the directory.
    pub buckets: u64,
    /// Objects in the directory.
    pub objects: u64,
    /// Cells authenticated successfully.
    pub cells_ok: u64,
    /// Cells never written.
    pub cells_unused: u64,
    /// Cells that failed authentication: (cell, error).
    pub bad_cells: Vec<(u64, String)>,
    /// Directory inconsistencies.
    pub directory_problems: Vec<String>,
}

impl Report {
    /// Whether everything checked out.
    pub fn is_clean(&self) -> bool {
        self.bad_cells.is_empty() && self.directory_problems.is_empty()
    }
}

/// Verifies an opened gateway; `progress(done, total)` reports cells checked.
pub async fn verify(opened: &Opened, progress: impl FnMut(u64, u64)) -> Result<Report> {
    let dir = opened.objects.directory();
    let (buckets, objects) = dir.counts()?;
    let directory_problems = dir.check()?;
    let cells = opened.objects.verify_cells(progress).await?;
    Ok(Report {
        buckets,
        objects,
        cells_ok: cells.cells_checked,
        cells_unused: cells.never_written,
        bad_cells: cells.failures,
        directory_problems,
    })
}
