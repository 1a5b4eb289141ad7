//! Nothing here: the tests in `tests/` are the point of this crate.
