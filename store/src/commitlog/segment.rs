//! One segment file of the CommitLog: where it starts and its mapping.

use crate::mapped_file::MappedFile;

/// One segment file.
#[derive(Debug)]
pub(crate) struct Segment {
    pub start: u64,
    pub file: MappedFile,
}

impl Segment {
    pub fn end(&self) -> u64 {
        self.start + self.file.len()
    }
}
