//! Config files in general: reading a TOML file into a typed config and the
//! error that says why a config is unusable. The broker's own config is
//! [`crate::broker::config`], the NameServer's [`crate::namesrv::config`].

use std::path::{Path, PathBuf};

/// Why a config is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// Reads and parses a TOML config file (unknown keys are refused by the
/// type's `deny_unknown_fields`).
pub fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    parse_toml(path, &read_text(path)?)
}

/// A config file's text.
pub fn read_text(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses config text read from `path` (named in errors).
pub fn parse_toml<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
