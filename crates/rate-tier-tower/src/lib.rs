//! Plan-aware rate limiting for Tower services.
