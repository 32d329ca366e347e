//! verify-log
