use super::*;

#[test]
fn numbers_read_as_serde_json_reads_them() {
    for text in [
        "0",
        "7",
        "-7",
        "0.5",
        "-0.5",
        "0.1",
        "0.123",
        "1e3",
        "1E-3",
        "2.5e+2",
        "123456789.123456789",
        "9007199254740993",
        "9007199254740993.0",
        "18446744073709551615",
        "-9223372036854775807",
        "1e22",
        "1e23",
        "4.9e-324",
        "1.7976931348623157e308",
        "0.30000000000000004",
        "1e-400",
        "-0.0",
        "-0",
        "-5",
        "1234567890123456789",
        "12345678901234567890",
        "0.000000000000000000001",
        "0.1234567890123456789",
        "1767225600000",
    ] {
        let mut keys = Vec::new();
        let mut s = Scanner::new(text.as_bytes(), &mut keys);
        let ours = s.number();
        let theirs: serde_json::Value = serde_json::from_str(text).expect(text);
        // The one-pass reading agrees with the full one wherever it reads a number.
        let mut no_keys = Vec::new();
        let mut plain = Scanner::new(text.as_bytes(), &mut no_keys);
        if let Some(n) = plain.plain_number() {
            assert_eq!(plain.at, text.len(), "{text}");
            assert_eq!(Some(n.to_bits()), theirs.as_f64().map(f64::to_bits), "{text}");
        }
        match ours {
            Some(Raw::UInt(u)) => assert_eq!(theirs.as_u64(), Some(u), "{text}"),
            Some(Raw::Int(i)) => assert_eq!(theirs.as_i64(), Some(i), "{text}"),
            Some(Raw::Float(f)) => {
                assert!(theirs.is_f64(), "{text}");
                assert_eq!(theirs.as_f64().map(f64::to_bits), Some(f.to_bits()), "{text}");
            }
            Some(_) => panic!("{text}: not a number"),
            None => {}
        }
    }
    for bad in ["01", "-", "1.", ".5", "1e", "1e+", "-01"] {
        let mut keys = Vec::new();
        let mut s = Scanner::new(bad.as_bytes(), &mut keys);
        let whole = s.number().is_some() && s.at == bad.len();
        assert!(!whole, "{bad} is not JSON");
    }
}

#[test]
fn thirteen_digit_times_read_as_the_number_reader_reads_them() {
    let mut taken = 0;
    for text in [
        "1767225600000,",
        "1767225600000}",
        "9999999999999 ",
        "1000000000000,",
        "0767225600000,",
        "17672256000001,",
        "1767225600000.5,",
        "1767225600000e3,",
        "176722560a000,",
        "1767225600000",
        "-767225600000,",
        "1767:25600000,",
    ] {
        let mut keys = Vec::new();
        let mut word = Scanner::new(text.as_bytes(), &mut keys);
        let mut keys = Vec::new();
        let mut digits = Scanner::new(text.as_bytes(), &mut keys);
        // Where the word reader takes a time, the digit loop reads the same and stops at
        // the same place; where it does not, `plain_millis` goes to the loop.
        let by_digits = digits.plain_integer_millis();
        if let Some(millis) = word.thirteen_digits() {
            taken += 1;
            assert_eq!(Some(millis), by_digits, "{text}");
            assert_eq!(word.at, digits.at, "{text}");
        } else {
            assert_eq!(word.at, 0, "{text}: nothing read");
        }
        // And `plain_millis` as a whole reads as the digit loop does.
        let mut keys = Vec::new();
        let mut whole = Scanner::new(text.as_bytes(), &mut keys);
        assert_eq!((whole.plain_millis(), whole.at), (by_digits, digits.at), "{text}");
    }
    assert_eq!(taken, 4, "the four well-formed thirteen-digit times");
}

/// The fast path either gives up or decodes exactly what serde_json's path decodes, on
/// well-formed lines of every stream and on random damage to them.
#[test]
fn agrees_with_serde_json_on_mutated_lines() {
    let lines = [
        r#"{"stream":"task_usage","ts":1767225600000,"job_id":"j1","task_index":3,"machine_id":"m7","cpu":0.953,"mem":0.2}"#,
        r#"{ "stream" : "task_event" , "ts" : "2026-01-01T00:00:01.5Z", "job_id": 42, "task_index": "3", "type": "FAIL", "extra": true }"#,
        r#"{"stream":"machine_event","ts":-1.5e3,"machine_id":"mé","type":"REMOVE","cpus":4,"memory":1E2}"#,
        r#"{"stream":"metric","ts":1,"host":"hé","name":"cpu","value":-0.0,"unknown":null}"#,
        r#"{"ts":5,"host":"h","name":"n","value":12345678901234567}"#,
        r#"{"stream":"task_usage","ts":0,"cpu":"0.5","mem":null,"max_cpu":1e400}"#,
        // Keys that start like the previous line's, at the same places.
        r#"{"stream":"task_event","ts":2,"cpu_request":1,"mem_request":2,"machine_id":"m1"}"#,
        r#"{"stream":"task_event","ts":2,"cpu_req":1,"mem_request_":2,"machine_i":"m1"}"#,
    ];
    let alphabet = b"{}[]\":,.-+0123456789eE tfnul\"\\\n\t\x01abc\xc3\xa9";
    let mut rng = fastrand::Rng::with_seed(20261130);
    let (mut scanned, mut shaped, mut timed) = (0, 0, 0);
    // Judges task_usage by its numbers, and refuses the events of every other stream.
    let rule = "rule hot { task t use machine m as e where e.cpu > 0.9 and e.mem <= 0.5 }";
    let plans = vigil_lang::compile("hot.saql", rule.as_bytes()).plans;
    let gate = crate::engine::Engine::new(plans, Default::default()).gate();
    for round in 0..20_000 {
        let base = lines[round % lines.len()];
        let mut bytes = base.as_bytes().to_vec();
        for _ in 0..rng.usize(0..4) {
            let at = rng.usize(0..=bytes.len());
            match rng.u8(0..3) {
                0 if at < bytes.len() => {
                    bytes.remove(at);
                }
                1 if at < bytes.len() => bytes[at] = alphabet[rng.usize(0..alphabet.len())],
                _ => bytes.insert(at, alphabet[rng.usize(0..alphabet.len())]),
            }
        }
        // Damage may break UTF-8 too: a line either path takes must be valid.
        let agrees = |default: Option<Stream>, fast: Event| {
            let line = std::str::from_utf8(&bytes).expect("a line the scanner takes is UTF-8");
            assert_eq!(super::super::json::decode_with_serde(line, default, Catalog::prelude()), Ok(fast), "{line}");
        };
        for default in [None, Some(Stream::Metric)] {
            if let Some(fast) = scan(&bytes, default, Catalog::prelude(), &mut ScanMemory::default()) {
                scanned += 1;
                agrees(default, fast);
            }
            // The same damage against the shape of the undamaged line.
            let mut keys = Vec::new();
            let shape = scan_with(base.as_bytes(), default, Catalog::prelude(), &mut keys).map(|(_, shape)| shape);
            let Some(shape) = shape else { continue };
            // Read into a spare that still holds another line's values: one of another
            // stream, and one of the same stream with a value in every field, text long
            // enough to be shared among them.
            let other = Stream::BUILT_IN.into_iter().find(|s| *s != shape.stream).expect("streams");
            for stream in [other, shape.stream] {
                let mut spare = Event::new(stream, 99);
                spare.fields.fill(Value::str("a value of a line read before this one"));
                let mut spares = vec![Arc::new(spare)];
                match shape.fill_spare(&bytes, default, &mut spares) {
                    Some(fast) => {
                        shaped += 1;
                        assert!(spares.is_empty());
                        agrees(default, Arc::unwrap_or_clone(fast));
                    }
                    None => assert_eq!(spares.len(), 1, "the spare comes back"),
                }
            }
            // A time alone only for a line that is an event the gate's rule does not take.
            if let Some(ts) = shape.time_only(&bytes, default, &gate) {
                timed += 1;
                let line = std::str::from_utf8(&bytes).expect("a line the scanner takes is UTF-8");
                let event = super::super::json::decode_with_serde(line, default, Catalog::prelude())
                    .expect("a line the gate checked");
                assert_eq!(event.ts, ts, "{line}");
                let number = |name| event.get(name).as_f64().unwrap_or(f64::NAN);
                let taken = event.stream == Stream::TaskUsage && number("cpu") > 0.9 && number("mem") <= 0.5;
                assert!(!taken, "the gate refused an event its rule takes: {line}");
            }
        }
    }
    // Plain lines take the fast path; escapes, a missing stream, overflow do not.
    assert!(scanned > 5_000, "only {scanned} lines took the fast path");
    assert!(shaped > 2_000, "only {shaped} lines had the shape of their undamaged line");
    assert!(timed > 1_000, "only {timed} lines were refused by the gate");
    for line in [lines[0], lines[1]] {
        assert!(scan(line.as_bytes(), None, Catalog::prelude(), &mut ScanMemory::default()).is_some(), "{line}");
    }
}
