//! Headers step: who pays. The tenant comes from an API key (hashed, or listed in `api_keys`), from the
//! tenant header the configuration trusts, or from `default_tenant`; its groups from `tenant_groups` or
//! the trusted group headers. 401 when nobody can be named, 403 for a header naming a key-derived
//! tenant. The sources and their precedence are [`crate::identity`]'s.

use crate::flow::cx::Cx;
use crate::flow::effect::Headers;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::state::Meta;
use crate::identity;

/// Resolves the tenant and its groups into `meta`.
pub(in crate::flow) fn resolve(
    cx: &mut Cx,
    h: &dyn Headers,
    meta: &mut Meta,
) -> Result<(), Box<Denial>> {
    let cfg = cx.cfg;
    let header_tenant = cfg.tenant_header.as_deref().and_then(|n| h.get(n));
    if let (Some(name), Some(t)) = (cfg.tenant_header.as_deref(), header_tenant) {
        // Tenants derived from API keys are `key:<hash>`: nobody may name one in a header (a forged
        // `key:` tenant would charge someone else's key).
        if t.trim()
            .get(..4)
            .is_some_and(|p| p.eq_ignore_ascii_case("key:"))
        {
            return Err(Denial::new(
                Reason::ForbiddenTenant,
                answers::forbidden_tenant(name),
            ));
        }
    }
    // A key header sent twice with different values is two keys as well.
    let repeated = h.differs("authorization") || h.differs("x-api-key");
    let key = match identity::api_key(h.get("authorization"), h.get("x-api-key")).and_then(|k| {
        if repeated {
            Err(identity::TwoKeys)
        } else {
            Ok(k)
        }
    }) {
        Ok(key) => key,
        // Two different keys name no tenant; they only matter where the key would.
        Err(identity::TwoKeys)
            if !cfg.api_key_tenants || identity::is_tenant_name(header_tenant) =>
        {
            None
        }
        Err(identity::TwoKeys) => {
            return Err(Denial::new(Reason::TwoApiKeys, answers::two_api_keys()));
        }
    };
    let sources = identity::Sources {
        api_key_tenants: cfg.api_key_tenants,
        api_keys: cfg.api_keys.as_ref(),
        default_tenant: cfg.default_tenant.as_deref(),
    };
    match identity::resolve(header_tenant, key, sources, &mut cx.worker.key_tenants) {
        identity::Resolved::Tenant(t, _) => meta.tenant = t,
        identity::Resolved::UnknownKey => {
            return Err(Denial::new(
                Reason::UnknownApiKey,
                answers::unknown_api_key(),
            ));
        }
        identity::Resolved::Nobody => {
            return Err(Denial::new(Reason::NoTenant, answers::missing_tenant()));
        }
    }
    if !cfg.groups.is_empty() {
        meta.groups = match cfg.tenant_groups.get(&meta.tenant) {
            Some(g) => g.clone(),
            // From the trusted headers; a value that is not a group id is no group.
            None => cfg
                .groups
                .iter()
                .map(|l| {
                    l.header
                        .as_deref()
                        .and_then(|n| h.get(n))
                        .map(str::trim)
                        .filter(|v| identity::valid_tenant(v))
                        .map(str::to_string)
                })
                .collect(),
        };
    }
    Ok(())
}
