//! Where a configuration comes from: the filter's JSON itself, or the filter configurations found in an
//! Envoy bootstrap or Istio manifests (YAML or JSON, one or several documents).
//!
//! ```text
//! config.json                      the plugin configuration, passed byte for byte to the filter's parser
//! envoy.yaml                       every envoy.filters.http.wasm typed_config whose configuration is a
//!                                  google.protobuf.StringValue: its `value` (the JSON string) byte for byte
//! wasmplugin.yaml (Istio)          every `kind: WasmPlugin`: `spec.pluginConfig` (an object) as JSON
//! ```
//!
//! A file with several filters yields them all, each with a locator (`document 2, WasmPlugin tokengate`);
//! wasm filters that are plainly another plugin (neither `root_id`, `vm_id`, `name` nor the module's file
//! name says tokengate) are left out when a tokengate one is there.

use crate::fail::Failure;
use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

/// One filter configuration found in a file.
#[derive(Debug, Clone)]
pub struct Found {
    /// Where it was found: the file, and inside a bootstrap or manifest the document and the filter.
    pub locator: String,
    /// The plugin configuration as the filter receives it.
    pub bytes: Vec<u8>,
    /// The filter's name there (`config.name` / `root_id`, or the WasmPlugin's `metadata.name`).
    pub name: String,
    /// The clusters its Envoy bootstrap defines, when that is all of them (`static_resources.clusters`
    /// and no dynamic cluster source); `None` when they are not all in the file.
    pub clusters: Option<Vec<String>>,
}

const WASM_FILTER: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// The filter configurations in `text`, read from `file`.
pub fn find(file: &str, text: &[u8]) -> Result<Vec<Found>, Failure> {
    let start = text.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if start == Some(b'{') {
        // JSON: the plugin configuration itself, unless it is an Envoy bootstrap or a manifest.
        let envoy =
            matches!(serde_json::from_slice::<Value>(text), Ok(v) if looks_like_envoy_or_istio(&v));
        if !envoy {
            return Ok(vec![Found {
                locator: file.to_string(),
                bytes: text.to_vec(),
                name: String::new(),
                clusters: None,
            }]);
        }
    }
    let s = std::str::from_utf8(text)
        .map_err(|e| Failure::input(format!("{file}: not UTF-8 text: {e}")))?;
    let docs = YamlLoader::load_from_str(s)
        .map_err(|e| Failure::input(format!("{file}: not valid YAML: {e}")))?;
    let mut values = Vec::with_capacity(docs.len());
    for (i, d) in docs.iter().enumerate() {
        values.push(
            to_json(d).map_err(|e| Failure::input(format!("{file}: document {}: {e}", i + 1)))?,
        );
    }
    walk_documents(file, &docs, values)
}

fn looks_like_envoy_or_istio(v: &Value) -> bool {
    v.get("static_resources").is_some()
        || v.get("kind").is_some() && v.get("apiVersion").is_some()
        || v.get("@type").and_then(Value::as_str) == Some(WASM_FILTER)
}

fn walk_documents(file: &str, yaml: &[Yaml], docs: Vec<Value>) -> Result<Vec<Found>, Failure> {
    let mut all = Vec::new();
    let many = docs.len() > 1;
    for (i, doc) in docs.iter().enumerate() {
        let doc_label = if many {
            format!("{file}: document {}", i + 1)
        } else {
            file.to_string()
        };
        if doc.get("kind").and_then(Value::as_str) == Some("WasmPlugin") {
            let name = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            // Serialised from the YAML node, in the order written (what Istio hands the filter).
            let bytes = match yaml.get(i).map(|d| &d["spec"]["pluginConfig"]) {
                None | Some(Yaml::BadValue | Yaml::Null) => Vec::new(),
                Some(node) => {
                    let mut s = String::new();
                    json_text(node, &mut s).map_err(|e| {
                        Failure::input(format!("{doc_label}: spec.pluginConfig: {e}"))
                    })?;
                    s.into_bytes()
                }
            };
            all.push(Candidate {
                found: Found {
                    locator: format!("{doc_label}, WasmPlugin {name} spec.pluginConfig"),
                    bytes,
                    name,
                    clusters: None,
                },
                ours: true,
            });
            continue;
        }
        let from = all.len();
        walk(doc, &mut String::new(), &doc_label, &mut all)?;
        if let Some(names) = static_clusters(doc) {
            for c in all.iter_mut().skip(from) {
                c.found.clusters = Some(names.clone());
            }
        }
    }
    let any_ours = all.iter().any(|c| c.ours);
    Ok(all
        .into_iter()
        .filter(|c| c.ours || !any_ours)
        .map(|c| c.found)
        .collect())
}

/// The cluster names of a bootstrap whose clusters are all in it: `static_resources.clusters`, and no
/// `dynamic_resources` (CDS or ADS could add others).
fn static_clusters(doc: &Value) -> Option<Vec<String>> {
    if doc.get("dynamic_resources").is_some() {
        return None;
    }
    let list = doc.pointer("/static_resources/clusters")?.as_array()?;
    Some(
        list.iter()
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .map(str::to_string)
            .collect(),
    )
}

struct Candidate {
    found: Found,
    /// It names tokengate somewhere (root_id, vm_id, name, module file, WasmPlugin).
    ours: bool,
}

fn walk(v: &Value, path: &mut String, doc: &str, out: &mut Vec<Candidate>) -> Result<(), Failure> {
    match v {
        Value::Object(m) => {
            if m.get("@type").and_then(Value::as_str) == Some(WASM_FILTER) {
                out.push(wasm_filter(v, path, doc)?);
                return Ok(());
            }
            for (k, child) in m {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                walk(child, path, doc, out)?;
                path.truncate(len);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(child, path, doc, out)?;
                path.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

fn wasm_filter(v: &Value, path: &str, doc: &str) -> Result<Candidate, Failure> {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("");
    let name = [s("/config/name"), s("/config/root_id")]
        .into_iter()
        .find(|n| !n.is_empty())
        .unwrap_or("")
        .to_string();
    let ours = [
        s("/config/name"),
        s("/config/root_id"),
        s("/config/vm_config/vm_id"),
        s("/config/vm_config/code/local/filename"),
        s("/config/vm_config/code/remote/http_uri/uri"),
    ]
    .iter()
    .any(|x| x.contains("tokengate"));
    let locator = format!("{doc}, {path} (wasm filter {name})");
    let conf = v.pointer("/config/configuration");
    let bytes = match conf {
        None => Vec::new(),
        Some(c) => {
            let ty = c.get("@type").and_then(Value::as_str).unwrap_or("");
            if !ty.ends_with("google.protobuf.StringValue") {
                return Err(Failure::input(format!(
                    "{locator}: configuration is a {ty:?}, not a google.protobuf.StringValue holding the JSON"
                )));
            }
            c.get("value")
                .and_then(Value::as_str)
                .unwrap_or("")
                .as_bytes()
                .to_vec()
        }
    };
    Ok(Candidate {
        found: Found {
            locator,
            bytes,
            name,
            clusters: None,
        },
        ours,
    })
}

/// A YAML node as JSON text, keys in the order written.
fn json_text(y: &Yaml, out: &mut String) -> Result<(), String> {
    match y {
        Yaml::Hash(h) => {
            out.push('{');
            for (i, (k, v)) in h.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key_text(k)?).to_string());
                out.push(':');
                json_text(v, out)?;
            }
            out.push('}');
        }
        Yaml::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_text(v, out)?;
            }
            out.push(']');
        }
        scalar => out.push_str(&to_json(scalar)?.to_string()),
    }
    Ok(())
}

fn key_text(k: &Yaml) -> Result<String, String> {
    Ok(match k {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Null => "null".to_string(),
        _ => return Err("a mapping key that is not a scalar".to_string()),
    })
}

/// A YAML node as a JSON value (for finding filters; key order is not kept).
fn to_json(y: &Yaml) -> Result<Value, String> {
    Ok(match y {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(r) => {
            let f: f64 = r
                .parse()
                .map_err(|_| format!("{r:?} is not a number JSON can hold"))?;
            serde_json::Number::from_f64(f)
                .map(Value::Number)
                .ok_or_else(|| format!("{r:?} is not a number JSON can hold"))?
        }
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(a) => Value::Array(a.iter().map(to_json).collect::<Result<_, _>>()?),
        Yaml::Hash(h) => {
            let mut m = serde_json::Map::new();
            for (k, v) in h {
                m.insert(key_text(k)?, to_json(v)?);
            }
            Value::Object(m)
        }
        Yaml::Alias(_) | Yaml::BadValue => return Err("an unresolved YAML alias".to_string()),
    })
}

/// The one configuration to use: `pick` (a filter's name or its 1-based number) among several.
pub fn pick(file: &str, found: Vec<Found>, pick: Option<&str>) -> Result<Found, Failure> {
    let n = found.len();
    if n == 0 {
        return Err(Failure::input(format!(
            "{file}: no tokengate filter configuration found (an envoy.filters.http.wasm filter with a \
             StringValue configuration, or an Istio WasmPlugin)"
        )));
    }
    match pick {
        None if n == 1 => found.into_iter().next().ok_or_else(|| Failure::input("empty")),
        None => Err(Failure::input(format!(
            "{file}: {n} filter configurations found; choose one with --plugin NAME or --plugin N:\n{}",
            list(&found)
        ))),
        Some(p) => {
            let by_index = p.parse::<usize>().ok().and_then(|i| i.checked_sub(1));
            let chosen = found
                .iter()
                .enumerate()
                .find(|(i, f)| Some(*i) == by_index || f.name == p)
                .map(|(i, _)| i);
            match chosen {
                Some(i) => found
                    .into_iter()
                    .nth(i)
                    .ok_or_else(|| Failure::input("no such filter")),
                None => Err(Failure::input(format!(
                    "{file}: no filter configuration named or numbered {p:?}:\n{}",
                    list(&found)
                ))),
            }
        }
    }
}

fn list(found: &[Found]) -> String {
    found
        .iter()
        .enumerate()
        .map(|(i, f)| format!("  {}: {}", i + 1, f.locator))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads `file` and returns its one filter configuration, parsed and validated by the filter's own
/// parser (the error names the file and says what the filter would log).
pub fn load(
    file: &str,
    plugin: Option<&str>,
) -> Result<(Found, tokengate::config::Config), Failure> {
    let text = std::fs::read(file).map_err(|e| Failure::input(format!("{file}: {e}")))?;
    let found = pick(file, find(file, &text)?, plugin)?;
    match tokengate::config::parse(&found.bytes) {
        Ok(cfg) => Ok((found, cfg)),
        Err(e) => Err(Failure::invalid(format!(
            "{}: invalid configuration: {e}",
            found.locator
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bootstrap_with_only_static_clusters_names_them_and_one_with_cds_does_not() {
        let yaml = |dynamic: &str| {
            format!(
                r#"
static_resources:
  listeners:
  - filter_chains:
    - filters:
      - typed_config:
          http_filters:
          - name: tokengate
            typed_config:
              "@type": {WASM_FILTER}
              config:
                root_id: tokengate
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '{{"quota": {{"cluster": "webdis"}}}}'
  clusters:
  - name: provider
  - name: redis
{dynamic}"#
            )
        };
        let f = find("e.yaml", yaml("").as_bytes()).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(
            f[0].clusters.as_deref(),
            Some(&["provider".to_string(), "redis".to_string()][..])
        );
        let f = find(
            "e.yaml",
            yaml("dynamic_resources:\n  cds_config: {}\n").as_bytes(),
        )
        .unwrap();
        assert_eq!(f[0].clusters, None);
        assert_eq!(
            find("c.json", br#"{"rules": []}"#).unwrap()[0].clusters,
            None
        );
    }

    #[test]
    fn a_json_file_is_the_plugin_configuration_byte_for_byte() {
        let text = br#"{"rules": [{"tokens_per_second": 1, "burst": 1}]}"#;
        let f = find("c.json", text).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].bytes, text.to_vec());
        assert_eq!(f[0].locator, "c.json");
    }

    #[test]
    fn an_envoy_bootstrap_yields_the_string_value_of_each_tokengate_wasm_filter() {
        let yaml = r#"
static_resources:
  listeners:
  - filter_chains:
    - filters:
      - typed_config:
          http_filters:
          - name: other
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config: {root_id: other, configuration: {"@type": type.googleapis.com/google.protobuf.StringValue, value: "{}"}}
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                root_id: tokengate
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: |
                    {"rules": [{"tokens_per_second": 1, "burst": 1}]}
"#;
        let f = find("envoy.yaml", yaml.as_bytes()).unwrap();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            f[0].bytes,
            b"{\"rules\": [{\"tokens_per_second\": 1, \"burst\": 1}]}\n".to_vec()
        );
        assert!(f[0].locator.contains("http_filters[1]"), "{}", f[0].locator);
        assert_eq!(f[0].name, "tokengate");
    }

    #[test]
    fn istio_manifests_yield_each_wasm_plugin_config_as_json() {
        let yaml = "kind: Namespace\napiVersion: v1\n---\napiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: tg}\nspec:\n  pluginConfig:\n    rules:\n    - {tokens_per_second: 1.5, burst: 10}\n";
        let f = find("m.yaml", yaml.as_bytes()).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(
            String::from_utf8(f[0].bytes.clone()).unwrap(),
            r#"{"rules":[{"tokens_per_second":1.5,"burst":10}]}"#
        );
        assert!(f[0].locator.contains("document 2"), "{}", f[0].locator);
        let one = pick("m.yaml", f.clone(), None).unwrap();
        assert_eq!(one.name, "tg");
        assert!(pick("m.yaml", f, Some("nope")).is_err());
    }

    #[test]
    fn several_filters_need_a_choice() {
        let doc = |n: &str| {
            format!("apiVersion: x/v1\nkind: WasmPlugin\nmetadata: {{name: {n}}}\nspec: {{pluginConfig: {{}}}}\n")
        };
        let yaml = format!("{}---\n{}", doc("a"), doc("b"));
        let f = find("m.yaml", yaml.as_bytes()).unwrap();
        assert_eq!(f.len(), 2);
        let err = pick("m.yaml", f.clone(), None).unwrap_err();
        assert!(err.message.contains("--plugin"), "{}", err.message);
        assert_eq!(pick("m.yaml", f.clone(), Some("2")).unwrap().name, "b");
        assert_eq!(pick("m.yaml", f, Some("a")).unwrap().name, "a");
    }
}
