use super::*;
use serde_json::{Map, Value};

fn json(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap()
}

fn s(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap()
}

fn model(m: &str) -> Edits {
    Edits {
        set_model: Some(m.into()),
        ..Edits::default()
    }
}

fn clamp(max: u64) -> Edits {
    Edits {
        clamp_max_output: Some(max),
        ..Edits::default()
    }
}

fn usage() -> Edits {
    Edits {
        inject_include_usage: true,
        ..Edits::default()
    }
}

#[test]
fn no_edits_return_none_without_reserializing() {
    let body = br#"{ "model" : "gpt-4.1", "messages": [] }"#;
    assert_eq!(rewrite(body, &Edits::default()), Ok(None));
}

#[test]
fn setting_the_same_model_is_no_change() {
    assert_eq!(
        rewrite(br#"{"model":"gpt-4.1"}"#, &model("gpt-4.1")),
        Ok(None)
    );
    // The same name spelled with an escape is the same model.
    assert_eq!(
        rewrite(br#"{"model":"gpt-4\u002e1"}"#, &model("gpt-4.1")),
        Ok(None)
    );
}

#[test]
fn setting_another_model_changes_only_the_model_bytes() {
    let body = br#"{ "model" :"gpt-4.1",
  "messages":[{"role":"user","content":"hi \u00e9 \/"}],  "x":{"z":1,"y":[1,2.50,1E3,null]} }"#;
    let out = rewrite(body, &model("gpt-4.1-mini")).unwrap().unwrap();
    assert_eq!(
        s(&out),
        s(body).replace(r#""gpt-4.1""#, r#""gpt-4.1-mini""#)
    );
}

#[test]
fn a_model_name_is_written_as_an_escaped_json_string() {
    let out = rewrite(br#"{"model":"a"}"#, &model("b\"\\\n\u{e9}"))
        .unwrap()
        .unwrap();
    assert_eq!(s(&out), "{\"model\":\"b\\\"\\\\\\n\u{e9}\"}");
    assert_eq!(json(&out)["model"], "b\"\\\n\u{e9}");
    // A missing model is added after the last member; to an empty object right after the brace.
    let out = rewrite(br#"{"messages":[] }"#, &model("m"))
        .unwrap()
        .unwrap();
    assert_eq!(s(&out), r#"{"messages":[],"model":"m" }"#);
    let out = rewrite(b"{ }", &model("m")).unwrap().unwrap();
    assert_eq!(s(&out), r#"{"model":"m" }"#);
}

#[test]
fn include_usage_is_injected_only_for_streams() {
    let e = usage();
    assert_eq!(rewrite(br#"{"model":"m"}"#, &e), Ok(None));
    assert_eq!(rewrite(br#"{"stream":false}"#, &e), Ok(None));
    assert_eq!(rewrite(br#"{"stream":"true"}"#, &e), Ok(None));
    let r = rewrite_with_report(br#"{"stream":true}"#, &e).unwrap();
    assert!(r.injected_include_usage);
    assert_eq!(
        s(&r.body.unwrap()),
        r#"{"stream":true,"stream_options":{"include_usage":true}}"#
    );
}

#[test]
fn include_usage_keeps_other_stream_options_and_is_not_reported_when_already_true() {
    let e = usage();
    let r = rewrite_with_report(
        br#"{"stream":true,"stream_options":{"include_obfuscation":false,"include_usage":false}}"#,
        &e,
    )
    .unwrap();
    assert!(r.injected_include_usage);
    assert_eq!(
        s(&r.body.unwrap()),
        r#"{"stream":true,"stream_options":{"include_obfuscation":false,"include_usage":true}}"#
    );
    let r = rewrite_with_report(
        br#"{"stream":true,"stream_options":{"include_obfuscation":false}}"#,
        &e,
    )
    .unwrap();
    assert_eq!(
        s(&r.body.unwrap()),
        r#"{"stream":true,"stream_options":{"include_obfuscation":false,"include_usage":true}}"#
    );
    let r = rewrite_with_report(br#"{"stream":true,"stream_options":{ }}"#, &e).unwrap();
    assert_eq!(
        s(&r.body.unwrap()),
        r#"{"stream":true,"stream_options":{"include_usage":true }}"#
    );
    let r = rewrite_with_report(
        br#"{"stream":true,"stream_options":{"include_usage":true}}"#,
        &e,
    )
    .unwrap();
    assert_eq!(r, Rewritten::default());
    let r = rewrite_with_report(br#"{"stream":true,"stream_options":null}"#, &e).unwrap();
    assert!(r.injected_include_usage);
    assert_eq!(
        s(&r.body.unwrap()),
        r#"{"stream":true,"stream_options":{"include_usage":true}}"#
    );
    assert_eq!(
        rewrite(br#"{"stream":true,"stream_options":"x"}"#, &e),
        Ok(None)
    );
}

#[test]
fn clamping_lowers_every_present_output_limit_above_the_grant() {
    let e = clamp(500);
    let out = rewrite(br#"{"max_tokens":4096,"max_completion_tokens":300}"#, &e)
        .unwrap()
        .unwrap();
    assert_eq!(s(&out), r#"{"max_tokens":500,"max_completion_tokens":300}"#);
    assert_eq!(rewrite(br#"{"max_output_tokens":500}"#, &e), Ok(None));
    for v in [
        "1e9",
        "1e2",
        "100.0",
        "-1",
        "\"100\"",
        "true",
        "18446744073709551616",
    ] {
        let body = format!(r#"{{"max_output_tokens": {v} }}"#);
        let out = rewrite(body.as_bytes(), &e).unwrap().unwrap();
        assert_eq!(s(&out), r#"{"max_output_tokens": 500 }"#, "{v}");
    }
}

#[test]
fn clamping_adds_the_given_field_when_no_limit_is_present() {
    let e = Edits {
        clamp_max_output: Some(64),
        max_output_field: "max_output_tokens".into(),
        ..Edits::default()
    };
    let out = rewrite(br#"{"input":"hi","max_tokens":null}"#, &e)
        .unwrap()
        .unwrap();
    assert_eq!(
        s(&out),
        r#"{"input":"hi","max_tokens":null,"max_output_tokens":64}"#
    );
}

#[test]
fn a_present_only_clamp_lowers_what_is_there_and_adds_nothing() {
    let e = Edits {
        clamp_max_output: Some(100),
        clamp_present_only: true,
        ..Edits::default()
    };
    assert_eq!(rewrite(br#"{"model":"a"}"#, &e), Ok(None));
    assert_eq!(rewrite(br#"{"max_tokens":50}"#, &e), Ok(None));
    assert_eq!(
        s(&rewrite(br#"{"max_tokens": 18446744073709551615 }"#, &e)
            .unwrap()
            .unwrap()),
        r#"{"max_tokens": 100 }"#
    );
}

#[test]
fn all_edits_combine_into_one_pass() {
    let e = Edits {
        set_model: Some("b".into()),
        inject_include_usage: true,
        clamp_max_output: Some(10),
        max_output_field: "max_tokens".into(),
        clamp_present_only: false,
        limit_at: LimitAt::Top,
    };
    let r = rewrite_with_report(br#"{"model":"a","stream":true}"#, &e).unwrap();
    assert!(r.model_changed && r.injected_include_usage && r.output_clamped);
    assert_eq!(
        s(&r.body.unwrap()),
        r#"{"model":"b","stream":true,"stream_options":{"include_usage":true},"max_tokens":10}"#
    );
}

#[test]
fn non_object_bodies_are_errors_not_panics() {
    let e = model("x");
    for b in [
        &b"not json"[..],
        b"[1]",
        b"",
        b"\"s\"",
        b"{\"a\":",
        b"  ",
        b"{}x",
    ] {
        assert!(rewrite(b, &e).is_err(), "{}", String::from_utf8_lossy(b));
    }
    assert_eq!(
        rewrite(b"[1]", &e),
        Err("body is not a JSON object".to_string())
    );
    assert_eq!(
        rewrite(br#"{"a":1e400}"#, &e),
        Err("body is not JSON: invalid number at byte 5".to_string())
    );
}

#[test]
fn unicode_and_escapes_survive_a_rewrite() {
    let body = "{\"model\":\"m\",\"messages\":[{\"content\":\"h\u{e9}llo \\\"q\\\" \\u2028 \u{1F600} \\ud83d\\ude00\"}]}";
    let out = rewrite(body.as_bytes(), &model("m2")).unwrap().unwrap();
    assert_eq!(s(&out), body.replace("\"m\"", "\"m2\""));
}

#[test]
fn duplicate_keys_are_read_last_and_written_everywhere() {
    // serde_json reads the last `model` ("b"): setting "b" changes nothing.
    assert_eq!(
        rewrite(br#"{"model":"a","model":"b"}"#, &model("b")),
        Ok(None)
    );
    // Setting another model writes every occurrence, so a first-wins reader agrees.
    let out = rewrite(br#"{"model":"a","x":1,"model":"b"}"#, &model("c"))
        .unwrap()
        .unwrap();
    assert_eq!(s(&out), r#"{"model":"c","x":1,"model":"c"}"#);
    // The last output limit decides; a clamp writes every occurrence.
    let out = rewrite(br#"{"max_tokens":99999,"max_tokens":10}"#, &clamp(500)).unwrap();
    assert_eq!(out, None, "serde_json reads 10, within the grant");
    let out = rewrite(br#"{"max_tokens":10,"max_tokens":99999}"#, &clamp(500))
        .unwrap()
        .unwrap();
    assert_eq!(s(&out), r#"{"max_tokens":500,"max_tokens":500}"#);
    // An escaped key is the same key.
    let out = rewrite(br#"{"max_\u0074okens":99999}"#, &clamp(500))
        .unwrap()
        .unwrap();
    assert_eq!(s(&out), r#"{"max_\u0074okens":500}"#);
    // `stream` is read last; stream_options is edited in its last occurrence.
    assert_eq!(
        rewrite(br#"{"stream":true,"stream":false}"#, &usage()),
        Ok(None)
    );
    let out = rewrite(
        br#"{"stream":true,"stream_options":{"a":1},"stream_options":{"include_usage":false,"include_usage":false}}"#,
        &usage(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        s(&out),
        r#"{"stream":true,"stream_options":{"a":1},"stream_options":{"include_usage":true,"include_usage":true}}"#
    );
}

#[test]
fn a_clamp_lowers_an_enabled_thinking_budget_below_the_new_limit() {
    let body = br#"{"model":"claude","max_tokens":16000,"thinking":{"type":"enabled","budget_tokens":10000},"messages":[]}"#;
    let r = rewrite_with_report(body, &clamp(4000)).unwrap();
    assert_eq!(r.thinking, Thinking::Lowered { budget: 3999 });
    assert_eq!(
        s(&r.body.unwrap()),
        r#"{"model":"claude","max_tokens":4000,"thinking":{"type":"enabled","budget_tokens":3999},"messages":[]}"#
    );
    // A budget already below the new limit is kept.
    let r = rewrite_with_report(body, &clamp(12000)).unwrap();
    assert_eq!(r.thinking, Thinking::Untouched);
    assert!(r.output_clamped);
    // Exactly at the minimum.
    let r = rewrite_with_report(body, &clamp(1025)).unwrap();
    assert_eq!(r.thinking, Thinking::Lowered { budget: 1024 });
    // No budget of 1024 fits below 1024: reported, the budget left as sent.
    let r = rewrite_with_report(body, &clamp(1024)).unwrap();
    assert_eq!(r.thinking, Thinking::DoesNotFit { max_tokens: 1024 });
    assert!(s(&r.body.unwrap()).contains(r#""budget_tokens":10000"#));
    // Disabled thinking, or no clamp of the body: nothing to do.
    let off = br#"{"max_tokens":16000,"thinking":{"type":"disabled"}}"#;
    assert_eq!(
        rewrite_with_report(off, &clamp(100)).unwrap().thinking,
        Thinking::Untouched
    );
    let small = br#"{"max_tokens":3000,"thinking":{"type":"enabled","budget_tokens":5000}}"#;
    assert_eq!(rewrite(small, &clamp(4000)), Ok(None));
    // The smallest remaining limit counts; a float budget is compared by value.
    let two = br#"{"max_tokens":3000,"max_completion_tokens":9000,"thinking":{"budget_tokens":2500.0,"type":"enabled"}}"#;
    let r = rewrite_with_report(two, &clamp(4000)).unwrap();
    assert_eq!(
        r.thinking,
        Thinking::Untouched,
        "3000 is the limit, 2500 < 3000"
    );
    let r = rewrite_with_report(two, &clamp(2000)).unwrap();
    assert_eq!(r.thinking, Thinking::Lowered { budget: 1999 });
}

// ---- Property tests: a seeded generator, the serde_json implementation as the oracle. ----

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
    fn chance(&mut self, pct: usize) -> bool {
        self.below(100) < pct
    }
}

fn ws(r: &mut Rng) -> &'static str {
    if r.chance(70) {
        ""
    } else {
        r.pick(&[" ", "\n  ", "\t", " \r\n "])
    }
}

fn scalar(r: &mut Rng) -> String {
    r.pick(&[
        "0",
        "-0",
        "17",
        "2.50",
        "1E3",
        "1e-7",
        "-12.5e+2",
        "true",
        "false",
        "null",
        "\"\"",
        "\"plain\"",
        "\"esc \\\" \\\\ \\/ \\n \\u00e9 \\ud83d\\ude00\"",
        "\"h\u{e9}llo \u{1F600}\"",
        "18446744073709551616",
        "123456789012345678901234567890",
    ])
    .to_string()
}

fn value(r: &mut Rng, depth: u32) -> String {
    if depth > 3 || r.chance(50) {
        return scalar(r);
    }
    let n = r.below(4);
    if r.chance(50) {
        let items: Vec<String> = (0..n)
            .map(|_| format!("{}{}{}", ws(r), value(r, depth + 1), ws(r)))
            .collect();
        format!("[{}{}]", items.join(","), ws(r))
    } else {
        let keys = ["a", "b", "type", "properties", "z", "a"];
        let items: Vec<String> = (0..n)
            .map(|_| {
                format!(
                    "{}\"{}\"{}:{}{}{}",
                    ws(r),
                    r.pick(&keys),
                    ws(r),
                    ws(r),
                    value(r, depth + 1),
                    ws(r)
                )
            })
            .collect();
        format!("{{{}{}}}", items.join(","), ws(r))
    }
}

/// A top-level member (key as written, value).
fn member(r: &mut Rng) -> (String, String) {
    let key = r.pick(&[
        "model",
        "mod\\u0065l",
        "stream",
        "stream_options",
        "max_tokens",
        "max_\\u0074okens",
        "max_completion_tokens",
        "max_output_tokens",
        "thinking",
        "messages",
        "temperature",
        "tools",
        "x",
    ]);
    let v = match key {
        "model" | "mod\\u0065l" => r
            .pick(&["\"gpt-4.1\"", "\"m\"", "\"gpt-4\\u002e1\"", "null", "3"])
            .to_string(),
        "stream" => r
            .pick(&["true", "true", "false", "\"true\"", "null"])
            .to_string(),
        "stream_options" => r
            .pick(&[
                "null",
                "{}",
                "{ \"include_usage\" : false }",
                "{\"include_usage\":true}",
                "{\"include_obfuscation\":false}",
                "{\"include_usage\":true,\"include_usage\":false}",
                "\"x\"",
            ])
            .to_string(),
        "max_tokens" | "max_\\u0074okens" | "max_completion_tokens" | "max_output_tokens" => r
            .pick(&[
                "100",
                "5000",
                "0",
                "1e3",
                "2000.0",
                "-1",
                "null",
                "\"9\"",
                "18446744073709551615",
                "18446744073709551616",
                "1025",
            ])
            .to_string(),
        "thinking" => {
            let budget = r.pick(&["1024", "1500", "4000", "10000", "3000.0", "\"x\"", "null"]);
            let kind = r.pick(&["\"enabled\"", "\"disabled\"", "\"enab\\u006ced\""]);
            match r.below(4) {
                0 => format!("{{\"type\":{kind},\"budget_tokens\":{budget}}}"),
                1 => format!("{{ \"budget_tokens\" : {budget} , \"type\" : {kind} }}"),
                2 => format!("{{\"type\":{kind}}}"),
                _ => "null".to_string(),
            }
        }
        _ => value(r, 1),
    };
    (key.to_string(), v)
}

fn body(r: &mut Rng) -> String {
    let n = r.below(9);
    let members: Vec<String> = (0..n)
        .map(|_| {
            let (k, v) = member(r);
            format!("{}\"{k}\"{}:{}{v}{}", ws(r), ws(r), ws(r), ws(r))
        })
        .collect();
    format!("{}{{{}{}}}{}", ws(r), members.join(","), ws(r), ws(r))
}

fn edits(r: &mut Rng) -> Edits {
    Edits {
        set_model: r.chance(40).then(|| {
            r.pick(&["gpt-4.1", "m", "fallback \"x\" \u{e9}"])
                .to_string()
        }),
        inject_include_usage: r.chance(50),
        clamp_max_output: r.chance(60).then(|| {
            *[0u64, 100, 500, 1024, 1025, 2000, 4000, 20000]
                .get(r.below(8))
                .unwrap()
        }),
        max_output_field: r.pick(&["max_tokens", "max_output_tokens"]).to_string(),
        clamp_present_only: r.chance(30),
        limit_at: LimitAt::Top,
    }
}

/// The serde_json implementation this module replaced (plus the thinking rule): the oracle.
fn oracle(v: &mut Value, e: &Edits) -> Rewritten {
    let obj = v.as_object_mut().unwrap();
    let mut r = Rewritten::default();
    if let Some(m) = &e.set_model {
        if obj.get("model").and_then(Value::as_str) != Some(m) {
            obj.insert("model".into(), Value::String(m.clone()));
            r.model_changed = true;
        }
    }
    if e.inject_include_usage && obj.get("stream") == Some(&Value::Bool(true)) {
        match obj.get_mut("stream_options") {
            None | Some(Value::Null) => {
                let mut so = Map::new();
                so.insert("include_usage".into(), Value::Bool(true));
                obj.insert("stream_options".into(), Value::Object(so));
                r.injected_include_usage = true;
            }
            Some(Value::Object(so)) => {
                if so.get("include_usage") != Some(&Value::Bool(true)) {
                    so.insert("include_usage".into(), Value::Bool(true));
                    r.injected_include_usage = true;
                }
            }
            Some(_) => {}
        }
    }
    if let Some(max) = e.clamp_max_output {
        let mut present = false;
        for f in MAX_OUTPUT_FIELDS {
            let Some(v) = obj.get_mut(f) else { continue };
            if v.is_null() {
                continue;
            }
            present = true;
            if v.as_u64().is_none_or(|n| n > max) {
                *v = Value::from(max);
                r.output_clamped = true;
            }
        }
        if !present && !e.clamp_present_only {
            obj.insert(e.max_output_field.clone(), Value::from(max));
            r.output_clamped = true;
        }
        if r.output_clamped {
            let limit = MAX_OUTPUT_FIELDS
                .iter()
                .chain([&e.max_output_field.as_str()])
                .filter_map(|f| obj.get(*f).and_then(Value::as_u64))
                .min()
                .unwrap();
            if let Some(Value::Object(t)) = obj.get_mut("thinking") {
                let budget = t.get("budget_tokens").and_then(Value::as_f64);
                if t.get("type") == Some(&Value::from("enabled"))
                    && budget.is_some_and(|b| b >= limit as f64)
                {
                    if limit.saturating_sub(1) < MIN_THINKING_BUDGET {
                        r.thinking = Thinking::DoesNotFit { max_tokens: limit };
                    } else {
                        t.insert("budget_tokens".into(), Value::from(limit - 1));
                        r.thinking = Thinking::Lowered { budget: limit - 1 };
                    }
                }
            }
        }
    }
    r
}

/// The key just before a value span (scanning back over `:` and whitespace), decoded.
fn key_before(body: &[u8], at: usize) -> String {
    let mut i = at;
    while matches!(body[i - 1], b' ' | b'\n' | b'\t' | b'\r' | b':') {
        i -= 1;
    }
    let end = i - 1; // closing quote
    let mut start = end - 1;
    while !(body[start] == b'"' && body[start - 1] != b'\\') {
        start -= 1;
    }
    serde_json::from_slice::<String>(&body[start..=end]).unwrap()
}

#[test]
fn random_bodies_and_edits_match_the_serde_json_oracle_and_keep_every_other_byte() {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let edited = [
        "model",
        "stream_options",
        "include_usage",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "budget_tokens",
    ];
    let (mut changed, mut lowered, mut not_fit) = (0, 0, 0);
    for case in 0..20_000 {
        let b = body(&mut r);
        let e = edits(&mut r);
        let mut want = json(b.as_bytes());
        let want_report = oracle(&mut want, &e);
        let (report, plan) = plan(b.as_bytes(), &e).unwrap();
        assert_eq!(report, want_report, "case {case}: {b} {e:?}");
        // Every splice replaces the value of an edited key, or inserts at an object's edge.
        for sp in &plan.splices {
            if sp.range.is_empty() {
                let before = b.as_bytes()[..sp.range.start].trim_ascii_end();
                let after = b.as_bytes()[sp.range.start..].trim_ascii_start();
                assert!(
                    before.ends_with(b"{") || after.starts_with(b"}"),
                    "case {case}: insertion inside an object: {b}"
                );
            } else {
                let k = key_before(b.as_bytes(), sp.range.start);
                assert!(edited.contains(&k.as_str()), "case {case}: edited {k}: {b}");
            }
        }
        let out = rewrite_with_report(b.as_bytes(), &e).unwrap();
        match &out.body {
            None => assert!(plan.splices.is_empty()),
            Some(out) => {
                changed += 1;
                let parsed: Value = serde_json::from_slice(out)
                    .unwrap_or_else(|err| panic!("case {case}: {b} {e:?} -> {} : {err}", s(out)));
                assert_eq!(parsed, want, "case {case}: {b} {e:?} -> {}", s(out));
            }
        }
        match report.thinking {
            Thinking::Lowered { .. } => lowered += 1,
            Thinking::DoesNotFit { .. } => not_fit += 1,
            Thinking::Untouched => {}
        }
    }
    // The generator reaches every branch.
    assert!(
        changed > 5_000 && lowered > 100 && not_fit > 100,
        "{changed} {lowered} {not_fit}"
    );
}

#[test]
fn the_scanner_accepts_exactly_what_serde_json_accepts() {
    let mut r = Rng(0xD1B5_4A32_D192_ED03);
    let noise: &[&[u8]] = &[
        b"\"",
        b"\\",
        b",",
        b":",
        b"{",
        b"}",
        b"[",
        b"]",
        b"-",
        b"0",
        b"e",
        b".",
        b"+",
        b"\x01",
        b"\xff",
        b"\xc3",
        b"\xe2\x80",
        b"\\u",
        b"\\ud800",
        b"\\udc00",
        b"\\x",
        b"t",
        b"nul",
        b" ",
        b"\x0c",
        b"1e400",
        b"\xed\xa0\x80",
    ];
    let (mut ok, mut refused) = (0, 0);
    for case in 0..40_000 {
        let mut b = body(&mut r).into_bytes();
        for _ in 0..1 + r.below(2) {
            if b.is_empty() {
                break;
            }
            let at = r.below(b.len());
            match r.below(3) {
                0 => {
                    b.remove(at);
                }
                1 => {
                    let n = noise[r.below(noise.len())];
                    b.splice(at..at, n.iter().copied());
                }
                _ => {
                    let n = noise[r.below(noise.len())];
                    let end = (at + n.len()).min(b.len());
                    b.splice(at..end, n.iter().copied());
                }
            }
        }
        let serde = serde_json::from_slice::<Value>(&b);
        let ours = scan::document(&b);
        let ours_ok = matches!(ours, Ok(Document::Object(_)));
        let serde_ok = matches!(serde, Ok(Value::Object(_)));
        assert_eq!(
            ours_ok,
            serde_ok,
            "case {case}: {:?}: serde {serde:?}",
            String::from_utf8_lossy(&b)
        );
        if serde_ok {
            ok += 1;
        } else {
            refused += 1;
        }
    }
    assert!(ok > 5_000 && refused > 20_000, "{ok} {refused}");
}

#[test]
fn the_scanner_refuses_the_edge_cases_serde_json_refuses() {
    let cases: &[&[u8]] = &[
        br#"{"a":"\ud800"}"#,
        br#"{"a":"\udc00"}"#,
        br#"{"a":"\ud800\u0041"}"#,
        br#"{"a":1e400}"#,
        br#"{"a":-1.5e99999999999}"#,
        br#"{"a":01}"#,
        br#"{"a":1.}"#,
        br#"{"a":.5}"#,
        br#"{"a":+1}"#,
        br#"{"a":-}"#,
        br#"{"a":"\x"}"#,
        b"{\"a\":\"\x1f\"}",
        b"{\"a\":\"\xff\"}",
        b"{\"\xc3\":1}",
        b"{\"a\":1}\x0c",
        b"\xef\xbb\xbf{}",
        br#"{"a":1,}"#,
        br#"{"a" 1}"#,
        br#"{a:1}"#,
        br#"{"a":[1,]}"#,
        br#"{"a":[1}"#,
        br#"{"a":tru}"#,
        br#"{"a":1}}"#,
    ];
    for c in cases {
        assert!(serde_json::from_slice::<Value>(c).is_err());
        assert!(scan::document(c).is_err(), "{}", String::from_utf8_lossy(c));
    }
    let long = format!("{{\"a\":1{}}}", "0".repeat(400));
    assert!(scan::document(long.as_bytes()).is_err());
    let accepted: &[&[u8]] = &[
        br#"{"a":"\ud83d\ude00","b":1e-400,"c":-0,"d":0e999999999999,"e":"\u0000\/"}"#,
        b"{\"a\":\"\x7f\"}",
        br#" {"a":[[],{},[{}]] , "b" : 123456789012345678901234567890 } "#,
    ];
    for c in accepted {
        assert!(serde_json::from_slice::<Value>(c).is_ok());
        assert!(scan::document(c).is_ok(), "{}", String::from_utf8_lossy(c));
    }
    // serde_json's recursion limit: 127 nested levels pass, 128 do not.
    for (depth, ok) in [(127usize, true), (128, false), (100_000, false)] {
        let b = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        );
        assert_eq!(serde_json::from_slice::<Value>(b.as_bytes()).is_ok(), ok);
        assert_eq!(scan::document(b.as_bytes()).is_ok(), ok, "{depth}");
    }
}

fn at(limit_at: LimitAt, max: u64, present_only: bool) -> Edits {
    Edits {
        clamp_max_output: Some(max),
        clamp_present_only: present_only,
        limit_at,
        ..Edits::default()
    }
}

fn edited(body: &str, e: &Edits) -> Option<String> {
    rewrite(body.as_bytes(), e)
        .unwrap()
        .map(|b| String::from_utf8(b).unwrap())
}

#[test]
fn gemini_limits_are_lowered_in_generation_config_in_either_spelling() {
    let e = at(LimitAt::Gemini, 100, false);
    assert_eq!(
        edited(
            r#"{"contents":[],"generationConfig":{"maxOutputTokens": 5000 ,"topK":3}}"#,
            &e
        )
        .as_deref(),
        Some(r#"{"contents":[],"generationConfig":{"maxOutputTokens": 100 ,"topK":3}}"#)
    );
    assert_eq!(
        edited(
            r#"{"generation_config":{"max_output_tokens":700,"maxOutputTokens":90}}"#,
            &e
        )
        .as_deref(),
        Some(r#"{"generation_config":{"max_output_tokens":100,"maxOutputTokens":90}}"#)
    );
    // At or below the grant: nothing to change. A top-level `max_tokens` is not Gemini's limit.
    assert_eq!(
        edited(r#"{"generationConfig":{"maxOutputTokens":100}}"#, &e),
        None
    );
    assert_eq!(
        edited(
            r#"{"max_tokens":9000,"generationConfig":{"maxOutputTokens":1}}"#,
            &e
        ),
        None
    );
    // Every occurrence of the object (duplicates, both spellings): every reader sees the limit.
    assert_eq!(
        edited(
            r#"{"generationConfig":{"maxOutputTokens":900},"generation_config":{},"generationConfig":{"maxOutputTokens":800}}"#,
            &e
        )
        .as_deref(),
        Some(
            r#"{"generationConfig":{"maxOutputTokens":100},"generation_config":{"maxOutputTokens":100},"generationConfig":{"maxOutputTokens":100}}"#
        )
    );
}

#[test]
fn gemini_without_a_limit_gets_one_in_generation_config() {
    let e = at(LimitAt::Gemini, 64, false);
    assert_eq!(
        edited(r#"{"contents":[]}"#, &e).as_deref(),
        Some(r#"{"contents":[],"generationConfig":{"maxOutputTokens":64}}"#)
    );
    assert_eq!(
        edited(r#"{"generationConfig":{}}"#, &e).as_deref(),
        Some(r#"{"generationConfig":{"maxOutputTokens":64}}"#)
    );
    assert_eq!(
        edited(r#"{"generationConfig":{"maxOutputTokens":null}}"#, &e).as_deref(),
        Some(r#"{"generationConfig":{"maxOutputTokens":64}}"#),
        "a null limit is set in place"
    );
    assert_eq!(
        edited(r#"{"generation_config":null,"x":1}"#, &e).as_deref(),
        Some(r#"{"generation_config":{"maxOutputTokens":64},"x":1}"#)
    );
    // Not an object: the provider refuses the body; it is left as sent.
    assert_eq!(edited(r#"{"generationConfig":"fast"}"#, &e), None);
    // Present only: nothing is added.
    assert_eq!(
        edited(r#"{"contents":[]}"#, &at(LimitAt::Gemini, 64, true)),
        None
    );
    let r = rewrite_with_report(br#"{"contents":[]}"#, &e).unwrap();
    assert!(r.output_clamped);
    assert_eq!(r.thinking, Thinking::Untouched);
}

#[test]
fn converse_limits_live_in_inference_config_and_claudes_thinking_stays_below_them() {
    let e = at(LimitAt::Converse, 2000, false);
    assert_eq!(
        edited(
            r#"{"messages":[],"inferenceConfig":{"maxTokens":8000}}"#,
            &e
        )
        .as_deref(),
        Some(r#"{"messages":[],"inferenceConfig":{"maxTokens":2000}}"#)
    );
    assert_eq!(
        edited(r#"{"messages":[]}"#, &e).as_deref(),
        Some(r#"{"messages":[],"inferenceConfig":{"maxTokens":2000}}"#)
    );
    let body = r#"{"inferenceConfig":{"maxTokens":8000},"additionalModelRequestFields":{"thinking":{"type":"enabled","budget_tokens":4000}}}"#;
    let r = rewrite_with_report(body.as_bytes(), &e).unwrap();
    assert_eq!(r.thinking, Thinking::Lowered { budget: 1999 });
    assert_eq!(
        s(&r.body.unwrap()),
        r#"{"inferenceConfig":{"maxTokens":2000},"additionalModelRequestFields":{"thinking":{"type":"enabled","budget_tokens":1999}}}"#
    );
    let r = rewrite_with_report(body.as_bytes(), &at(LimitAt::Converse, 1000, false)).unwrap();
    assert_eq!(r.thinking, Thinking::DoesNotFit { max_tokens: 1000 });
}

#[test]
fn invoke_bodies_are_clamped_in_the_models_own_field() {
    let nova = LimitAt::Invoke { nova: true };
    let other = LimitAt::Invoke { nova: false };
    // Claude's Messages body: `max_tokens` at the top, thinking kept below it.
    let claude = r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":5000,"thinking":{"type":"enabled","budget_tokens":3000}}"#;
    let r = rewrite_with_report(claude.as_bytes(), &at(other, 2000, false)).unwrap();
    assert_eq!(r.thinking, Thinking::Lowered { budget: 1999 });
    assert_eq!(
        edited(
            r#"{"anthropic_version":"x","messages":[]}"#,
            &at(other, 50, false)
        )
        .as_deref(),
        Some(r#"{"anthropic_version":"x","messages":[],"max_tokens":50}"#)
    );
    // Nova's messages-v1: `inferenceConfig.max_new_tokens`.
    assert_eq!(
        edited(r#"{"messages":[]}"#, &at(nova, 50, false)).as_deref(),
        Some(r#"{"messages":[],"inferenceConfig":{"max_new_tokens":50}}"#)
    );
    assert_eq!(
        edited(
            r#"{"schemaVersion":"messages-v1","inferenceConfig":{"max_new_tokens":900}}"#,
            &at(other, 50, false)
        )
        .as_deref(),
        Some(r#"{"schemaVersion":"messages-v1","inferenceConfig":{"max_new_tokens":50}}"#)
    );
    // Shapes the filter does not know: every known limit at the top or one object down; none added.
    assert_eq!(
        edited(
            r#"{"prompt":"hi","max_gen_len":512}"#,
            &at(other, 50, false)
        )
        .as_deref(),
        Some(r#"{"prompt":"hi","max_gen_len":50}"#)
    );
    assert_eq!(
        edited(
            r#"{"inputText":"hi","textGenerationConfig":{"maxTokenCount":4096,"temperature":0}}"#,
            &at(other, 50, false)
        )
        .as_deref(),
        Some(r#"{"inputText":"hi","textGenerationConfig":{"maxTokenCount":50,"temperature":0}}"#)
    );
    assert_eq!(edited(r#"{"prompt":"hi"}"#, &at(other, 50, false)), None);
    // A Llama body is not Nova's even when the model id says Nova: no `messages`.
    assert_eq!(edited(r#"{"prompt":"hi"}"#, &at(nova, 50, false)), None);
}

#[test]
fn family_clamps_keep_every_other_byte_and_parse_as_the_original_but_the_limit() {
    let bodies = [
        (
            LimitAt::Gemini,
            "/generationConfig/maxOutputTokens",
            "{ \"contents\" : [ {\"parts\":[{\"text\":\"h\\u00e9 \\/\"}]} ] ,\n \"generationConfig\" : { \"temperature\" : 1.50 , \"maxOutputTokens\" : 1e3 } }",
            "1e3",
        ),
        (
            LimitAt::Converse,
            "/inferenceConfig/maxTokens",
            "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}],\"inferenceConfig\":{\"stopSequences\":[],\"maxTokens\":4096}}",
            "4096",
        ),
    ];
    for (limit_at, ptr, body, limit) in bodies {
        let out = rewrite(body.as_bytes(), &at(limit_at, 7, false))
            .unwrap()
            .unwrap();
        let mut want = json(body.as_bytes());
        *want.pointer_mut(ptr).unwrap() = Value::from(7);
        assert_eq!(json(&out), want, "{body}");
        assert_eq!(
            s(&out),
            body.replacen(limit, "7", 1),
            "only the limit's bytes"
        );
    }
}
