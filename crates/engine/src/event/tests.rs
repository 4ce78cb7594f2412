use super::json::{Key, KeySeed};
use super::*;
use vigil_lang::schema::{field_id, Catalog, Stream};

#[test]
fn a_value_holds_short_text_in_its_24_bytes() {
    // Group keys and events are lists of values: a larger value would cost every key.
    assert_eq!(std::mem::size_of::<Value>(), 24);
    assert!(matches!(Value::str("m1234"), Value::Str(s) if !s.is_heap_allocated()));
    let long = "x".repeat(100);
    assert!(matches!(Value::str(&long), Value::Str(s) if s.is_heap_allocated() && *s == long));
}

#[test]
fn every_field_name_is_matched_to_its_number_and_its_place_in_each_stream() {
    for stream in Stream::BUILT_IN {
        for (p, (name, _)) in stream.fields().iter().enumerate() {
            let key: Result<Key, serde::de::value::Error> = serde::de::Visitor::visit_str(KeySeed, name);
            let g = field_id(name).expect("interned");
            assert!(matches!(key, Ok(Key::Field(n)) if n == g), "{name}");
            assert_eq!(stream.position_of_global(g), Some(p), "{name}");
        }
    }
}

#[test]
fn times_format_as_rfc3339_with_milliseconds() {
    assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(format_time(1_767_225_600_123), "2026-01-01T00:00:00.123Z");
    assert_eq!(format_time(-1), "1969-12-31T23:59:59.999Z");
    assert_eq!(format_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
    for ms in [0, 1_767_225_600_123, -86_400_001, 253_402_300_799_999] {
        assert_eq!(parse_time(&format_time(ms)), Some(ms));
    }
}

#[test]
fn stream_first_or_last_decodes_the_same() {
    let fields = r#""ts":"2026-01-01T00:00:00Z","machine_id":7,"job_id":"j","task_index":"3","cpu":0.5,"labels":{"a":"b"},"extra":[1,[2]]"#;
    let first = decode(&format!(r#"{{"stream":"task_usage",{fields}}}"#), None).expect("event");
    let last = decode(&format!(r#"{{{fields},"stream":"task_usage"}}"#), None).expect("event");
    assert_eq!(first, last);
    assert_eq!(first.get("machine_id"), Value::str("7"));
    assert_eq!(first.get("task_index"), Value::Num(3.0));
    for bad in [r#""cpu":"high""#, r#""cpu":[1]"#, r#""job_id":{"x":1}"#] {
        let a = decode(&format!(r#"{{"stream":"task_usage","ts":0,{bad}}}"#), None).expect_err("bad");
        let b = decode(&format!(r#"{{"ts":0,{bad},"stream":"task_usage"}}"#), None).expect_err("bad");
        assert_eq!(a.to_string(), b.to_string());
    }
    let twice = decode(r#"{"stream":"metric","ts":0,"stream":"task_usage"}"#, None).expect_err("two streams");
    assert_eq!(twice.field.as_deref(), Some("stream"));
}

#[test]
fn a_key_given_twice_is_refused_whichever_comes_first() {
    // A second `ts` would otherwise win, and could hide a hostile time behind a normal one.
    for line in [
        r#"{"stream":"metric","ts":0,"host":"h","ts":253402300799999}"#,
        r#"{"ts":0,"host":"h","ts":1,"stream":"metric"}"#,
        r#"{"stream":"metric","ts":0,"host":"h","host":"g"}"#,
        r#"{"host":"h","ts":0,"host":"g","stream":"metric"}"#,
        r#"{"stream":"metric","ts":0,"stream":"metric"}"#,
    ] {
        let e = decode(line, None).expect_err(line);
        assert!(e.reason.contains("given twice"), "{line}: {e}");
    }
    // Keys the event's stream does not declare may repeat: Vigil does not read them, whether
    // or not another stream declares them.
    assert!(decode(r#"{"stream":"metric","ts":0,"x":1,"x":2}"#, None).is_ok());
    assert!(decode(r#"{"stream":"task_usage","ts":0,"host":1,"host":2}"#, None).is_ok());
}

#[test]
fn time_bounds_refuse_times_out_of_range_and_too_far_ahead() {
    let now = 1_767_225_600_000;
    let bounds = TimeBounds { max_future_ms: Some(300_000), max_jump_ms: Some(3_600_000) };
    assert!(bounds.check(now, now, None).is_ok());
    assert!(bounds.check(now + 300_000, now, Some(now)).is_ok());
    let far = bounds.check(MAX_TS, now, None).expect_err("far future");
    assert!(far.to_string().starts_with("field `ts`: 9999-12-31T23:59:59.999Z is 7973.8 years ahead"), "{far}");
    for ts in [i64::MAX, i64::MIN, -1, MAX_TS + 1] {
        let e = TimeBounds::default().check(ts, now, None).expect_err("out of range");
        assert!(e.reason.contains("outside 1970-01-01 to 9999-12-31"), "{e}");
    }
    let jump = bounds.check(now - 600_000, now, Some(now - 4_300_000)).expect_err("a jump");
    assert!(jump.reason.contains("ahead of event time"), "{jump}");
    assert!(TimeBounds::default().check(MAX_TS, now, Some(0)).is_ok(), "no limits but the range");
}

#[test]
fn decodes_rfc3339_and_epoch_millis() {
    let a = decode(r#"{"stream":"metric","ts":"2026-01-01T00:00:01.500Z","host":"h","name":"cpu","value":3}"#, None)
        .expect("valid");
    let b = decode(r#"{"stream":"metric","ts":1767225601500,"host":"h","name":"cpu","value":3}"#, None).expect("valid");
    assert_eq!(a, b);
    assert_eq!(format_time(a.ts), "2026-01-01T00:00:01.500Z");
    assert_eq!(a.get("value"), Value::Num(3.0));
}

#[test]
fn numeric_ids_become_text_and_unknown_fields_are_ignored() {
    let e = decode(r#"{"stream":"task_event","ts":0,"job_id":42,"task_index":"3","type":"FAIL","extra":[1]}"#, None)
        .expect("valid");
    assert_eq!(e.get("job_id"), Value::str("42"));
    assert_eq!(e.get("task_index"), Value::Num(3.0));
    assert_eq!(e.event_type(), Some("FAIL"));
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (r#"{"ts":0}"#, "field `stream`: missing"),
        (
            r#"{"stream":"nope","ts":0}"#,
            "field `stream`: unknown stream `nope`; expected one of task_event, task_usage, machine_event, metric",
        ),
        (r#"{"stream":"metric"}"#, "field `ts`: missing"),
        (r#"{"stream":"metric","ts":"yesterday"}"#, "field `ts`: `yesterday` is not an RFC 3339 time"),
        (r#"{"stream":"metric","ts":0,"value":"high"}"#, "field `value`: `high` is not a number"),
        (r#"{"stream":"metric","ts":0,"host":[1]}"#, "field `host`: expected string, found an array"),
        (r#"[1,2]"#, "an event must be a JSON object"),
    ];
    for (line, want) in cases {
        assert_eq!(decode(line, None).expect_err(line).to_string(), want);
    }
    assert!(decode("{", None).expect_err("truncated").to_string().starts_with("invalid JSON"));
}

fn k8s_catalog() -> Catalog {
    let text = "entity pod (namespace, pod)\nstream k8s_event { fields { namespace: string, pod: string, \
        reason: string, count?: number, labels?: map } entity pod (namespace, pod) operation reason \
        op pod evict = \"Evicted\" op pod event }";
    let (file, syntax) = vigil_lang::parser::parse(text);
    assert!(syntax.is_empty(), "{syntax:?}");
    let (catalog, problems) = Catalog::declare(&[&file]);
    assert!(problems.is_empty(), "{problems:?}");
    catalog
}

#[test]
fn a_declared_stream_is_read_by_its_declared_fields_on_both_paths() {
    let catalog = k8s_catalog();
    let stream = catalog.stream("k8s_event").expect("declared");
    let mut decoder = LineDecoder::new(catalog.clone());
    let first = r#"{"stream":"k8s_event","ts":60000,"namespace":"shop","pod":"cart-1","reason":"Evicted","count":2}"#;
    // The same line twice: scanned in full, then read by its remembered shape.
    for _ in 0..2 {
        let e = decoder.decode(first, None).expect(first);
        assert_eq!(e.stream, stream);
        assert_eq!(
            (e.get("pod"), e.get("count"), e.event_type()),
            (Value::str("cart-1"), Value::Num(2.0), Some("Evicted"))
        );
    }
    // Keys in any order, and an escaped string: serde_json's path.
    let shuffled =
        r#"{"reason":"Evi\u0063ted","pod":"cart-1","ts":60000,"namespace":"shop","stream":"k8s_event","count":2}"#;
    assert_eq!(decoder.decode(shuffled, None), decoder.decode(first, None));
    // Vigil's decoder of its own streams does not know it, and says which it knows.
    let err = decode(first, None).expect_err("not a stream of the prelude");
    assert!(err.reason.starts_with("unknown stream `k8s_event`; expected one of task_event, task_usage"), "{err}");
    let err = decoder.decode(r#"{"stream":"k8s_evnt","ts":1}"#, None).expect_err("unknown");
    assert!(err.reason.ends_with("metric, k8s_event"), "{err}");
}

#[test]
fn an_event_without_a_required_field_is_refused_naming_it() {
    let mut decoder = LineDecoder::new(k8s_catalog());
    for line in [
        r#"{"stream":"k8s_event","ts":1,"namespace":"shop","reason":"Evicted"}"#,
        r#"{"ts":1,"namespace":"shop","reason":"Evicted","stream":"k8s_event"}"#,
        r#"{"stream":"k8s_event","ts":1,"namespace":"shop","pod":null,"reason":"Evicted"}"#,
    ] {
        // Twice: the second time the line's shape is known.
        for _ in 0..2 {
            let err = decoder.decode(line, None).expect_err(line);
            assert_eq!(err.field.as_deref(), Some("pod"), "{line}");
            assert!(err.reason.contains("stream `k8s_event` declares it required"), "{err}");
        }
    }
    let fine = r#"{"stream":"k8s_event","ts":1,"namespace":"shop","pod":"p","reason":"Evicted"}"#;
    assert!(decoder.decode(fine, None).is_ok(), "optional fields may be left out");
}
