//! `blindfold verify`: checks every stored cell against the trusted versions and the directory
//! against the allocator.

use crate::open::Opened;
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
    /// Objects (`bucket/key`) that cannot be read while the bad cells are damaged: a block of
    /// theirs lies on a path through one.
    /// `None` when the engine cannot tell (a recursive position map).
    pub damaged_objects: Option<Vec<String>>,
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
    let damaged_objects = if cells.failures.is_empty() {
        Some(Vec::new())
    } else {
        let bad: Vec<u64> = cells.failures.iter().map(|f| f.0).collect();
        match opened.objects.blocks_through(&bad).await {
            Some(blocks) => {
                let blocks: std::collections::HashSet<u64> = blocks.into_iter().collect();
                let mut names = Vec::new();
                for (bucket, key, meta) in dir.all_objects()? {
                    if meta.blocks().any(|b| blocks.contains(&b)) {
                        names.push(format!("{bucket}/{key}"));
                    }
                }
                Some(names)
            }
            None => None,
        }
    };
    Ok(Report {
        buckets,
        objects,
        cells_ok: cells.cells_checked,
        cells_unused: cells.never_written,
        bad_cells: cells.failures,
        directory_problems,
        damaged_objects,
    })
}
