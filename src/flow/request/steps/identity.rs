//! Headers step: who pays. The tenant comes from a claim of a JWT that Envoy verified (`tenant_claim`,
//! read from the dynamic metadata `jwt_authn` writes), else from the tenant header a trusted filter set
//! (only with `trusted_headers`), else from an API key (listed in `api_keys`, or hashed), else from
//! `default_tenant`; its groups from `tenant_groups`, else each level's claim, else its trusted header.
//! Refusals: 401 when nobody can be named, for an unlisted key, for two keys and for a listed key of
//! another tenant than the verified one; 403 for a tenant header or claim naming a key-derived tenant
//! and for a claim that is not an id. The key is the credential the path's provider checks
//! ([`identity::KeyPlace`]). The rules are [`crate::identity::resolve`]'s.

use crate::config::{ClaimPath, Config};
use crate::flow::cx::Cx;
use crate::flow::effect::{Effect, Headers};
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::state::Meta;
use crate::identity::{self, Claim, KeyInputs, KeyPlace, Presented, Resolved};
use std::borrow::Cow;

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
        if is_key_tenant(t) {
            return Err(Denial::new(
                Reason::ForbiddenTenant,
                answers::forbidden_tenant(name),
            ));
        }
    }
    let claim_tenant = match &cfg.claims.tenant {
        Some(path) => claim(cx, cfg, path, "tenant_claim")?,
        None => None,
    };
    if let (Some(path), Some(t)) = (&cfg.claims.tenant, claim_tenant.as_deref()) {
        // Nor in a claim: a token's issuer names tenants it manages, not the hash of someone's key.
        if is_key_tenant(t) {
            return Err(Denial::new(
                Reason::ForbiddenTenant,
                answers::forbidden_claim_tenant(&path.display()),
            ));
        }
    }
    // The key is the credential the path's provider checks (other credential headers are ignored); a
    // key header sent twice with different values is two keys as well.
    let place = KeyPlace::of(meta.kind, meta.path_model.is_some(), meta.azure_v1);
    let inputs = KeyInputs {
        authorization: h.get("authorization"),
        x_api_key: h.get("x-api-key"),
        api_key: h.get("api-key"),
        x_goog_api_key: h.get("x-goog-api-key"),
        query: h
            .get(":path")
            .and_then(|p| p.split_once('?'))
            .map(|(_, q)| q.split('#').next().unwrap_or(q)),
    };
    let key = if place.headers().iter().any(|n| h.differs(n)) {
        Err(identity::TwoKeys)
    } else {
        identity::request_key(place, &inputs)
    };
    let presented = Presented {
        claim: claim_tenant.as_deref(),
        header: header_tenant,
        key: key.as_ref().map(Option::as_deref).map_err(|e| *e),
    };
    let sources = identity::Sources {
        api_key_tenants: cfg.api_key_tenants,
        api_keys: cfg.api_keys.as_ref(),
        default_tenant: cfg.default_tenant.as_deref(),
    };
    match identity::resolve(presented, sources, &mut cx.worker.key_tenants) {
        Resolved::Tenant(t, _) => meta.tenant = t,
        Resolved::UnknownKey => {
            return Err(Denial::new(
                Reason::UnknownApiKey,
                answers::unknown_api_key(),
            ));
        }
        Resolved::TwoKeys => {
            return Err(Denial::new(Reason::TwoApiKeys, answers::two_api_keys()));
        }
        Resolved::Conflict(verified, _) => {
            return Err(Denial::new(
                Reason::IdentityConflict,
                answers::identity_conflict(&verified),
            ));
        }
        Resolved::Nobody => {
            return Err(Denial::new(Reason::NoTenant, answers::missing_tenant()));
        }
    }
    if !cfg.groups.is_empty() {
        meta.groups = match cfg.tenant_groups.get(&meta.tenant) {
            Some(g) => g.clone(),
            None => {
                let mut groups = Vec::with_capacity(cfg.groups.len());
                for l in &cfg.groups {
                    let g = match (&l.claim, &l.header) {
                        (Some(path), _) => claim(cx, cfg, path, "groups[].claim")?,
                        // From the trusted header; a value that is not a group id is no group.
                        (None, Some(n)) => h
                            .get(n)
                            .map(str::trim)
                            .filter(|v| identity::valid_tenant(v))
                            .map(str::to_string),
                        (None, None) => None,
                    };
                    groups.push(g);
                }
                groups
            }
        };
    }
    Ok(())
}

/// Whether a tenant id names a tenant derived from an API key (`key:…`, any case, spaces around).
fn is_key_tenant(t: &str) -> bool {
    t.trim()
        .get(..4)
        .is_some_and(|p| p.eq_ignore_ascii_case("key:"))
}

/// A verified claim: `Ok(None)` when the payload has none (or there is no verified token), a 403 when
/// it is not an id (`what` names the setting in the answer).
fn claim(
    cx: &Cx,
    cfg: &Config,
    path: &ClaimPath,
    what: &str,
) -> Result<Option<String>, Box<Denial>> {
    let bytes = cx.host.property(&cfg.claims.property(path));
    match identity::read_claim(bytes.as_deref()) {
        Claim::Missing => Ok(None),
        Claim::Id(v) => Ok(Some(v)),
        Claim::Invalid => Err(Denial::new(
            Reason::InvalidClaim,
            answers::invalid_claim(&path.display(), what),
        )),
    }
}

/// The identity headers a trusted filter set for tokengate (the tenant and group headers) are not sent
/// on upstream (`forward_identity_headers: false`, the default): the provider has no use for them, and
/// a provider's logs should not learn who a gateway's tenants are. Applied to every request, metered or
/// not.
pub(in crate::flow) fn strip_headers(cx: &mut Cx, h: &dyn Headers) {
    let cfg = cx.cfg;
    if cfg.forward_identity_headers || cfg.trusted_headers.is_none() {
        return;
    }
    let names = cfg
        .tenant_header
        .iter()
        .chain(cfg.groups.iter().filter_map(|l| l.header.as_ref()));
    for name in names {
        if h.get(name).is_some() {
            cx.fx
                .push(Effect::RemoveRequestHeader(Cow::Owned(name.clone())));
        }
    }
}
