//! A fake Envoy for the flow tests (filled in below).
