//! The synthetic source's settings and its generator.

use super::generate::*;
use super::*;

#[test]
fn sizes_and_durations_parse() {
    assert_eq!(parse_size("14.5MiB"), Ok(15_204_352));
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("4096B"), Ok(4096));
    assert_eq!(parse_size("2KiB"), Ok(2048));
    assert_eq!(parse_size("1.5 KB"), Ok(1500));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert!(parse_size("1.2.3MiB").is_err());
    assert!(parse_size("").is_err());
    assert_eq!(parse_duration("8ms"), Ok(Duration::from_millis(8)));
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
    assert_eq!(parse_duration("250µs"), Ok(Duration::from_micros(250)));
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert_eq!(parse_duration("15ns"), Ok(Duration::from_nanos(15)));
    assert!(parse_duration("61s").is_err());
    assert!(parse_duration("3").is_err());
}

#[test]
fn filler_is_deterministic_and_mixed() {
    let model = FillerModel::new(DEFAULT_CHUNK);
    assert_eq!(model.templates.len(), TEMPLATES);
    let a = model.fill(threshold(0.5), 1, 10_000);
    assert_eq!(a, model.fill(threshold(0.5), 1, 10_000));
    assert_ne!(a, model.fill(threshold(0.5), 2, 10_000));
    assert_eq!(a.len(), 10_000);
    let templates = a
        .chunks(RECORD)
        .filter(|r| model.templates.iter().any(|t| t.starts_with(r)))
        .count();
    let records = a.len().div_ceil(RECORD);
    assert!(
        templates > records / 3 && templates < records * 2 / 3,
        "{templates} of {records}"
    );
    assert_eq!(threshold(1.0), 1 << 32);
    assert_eq!(threshold(0.0), 0);
}

#[test]
fn small_size_gives_the_empty_ledger() {
    let spec = SyntheticSpec {
        size: 10,
        ratio: 1.0,
        count: Some(2),
        ..SyntheticSpec::default()
    };
    let ledgers: Vec<Vec<u8>> = synthetic_ledgers(&spec).collect();
    assert_eq!(ledgers.len(), 2);
    assert!(ledgers[0].len() < MIN_SIZE as usize, "{}", ledgers[0].len());
}

#[test]
fn endless_stops_at_the_last_sequence() {
    let spec = SyntheticSpec {
        size: MIN_SIZE,
        ratio: 1.0,
        count: None,
        start: u32::MAX - 1,
        ..SyntheticSpec::default()
    };
    assert_eq!(synthetic_ledgers(&spec).count(), 2);
}

#[test]
fn chunk_setting_parses_and_is_bounded() {
    let spec = SyntheticSpec::parse_settings("size=594KiB,chunk=10KiB").unwrap();
    assert_eq!(spec.chunk, 10 << 10);
    assert_eq!(
        spec.to_string(),
        "size=608256,ratio=7.6,start=2,chunk=10240"
    );
    assert_eq!(SyntheticSpec::parse_settings(&spec.to_string()), Ok(spec));
    assert!(!SyntheticSpec::default().to_string().contains("chunk"));
    for bad in ["chunk=512", "chunk=17MiB", "chunk=ten"] {
        let err = SyntheticSpec::parse_settings(bad).unwrap_err();
        assert!(err.to_string().contains("chunk"), "{bad}: {err}");
    }
    assert_eq!(FillerModel::new(10 << 10).templates.len(), 10);
    assert_eq!(FillerModel::new(1 << 10).templates.len(), 4);
    assert_eq!(FillerModel::new(16 << 20).templates.len(), TEMPLATES);
}

/// zstd-1 ratio of `ledger` cut into `chunk`-byte pieces, as the relay compresses it.
fn chunked_ratio(ledgers: &[Vec<u8>], chunk: usize) -> f64 {
    let raw: usize = ledgers.iter().map(Vec::len).sum();
    let wire: usize = ledgers
        .iter()
        .flat_map(|l| l.chunks(chunk))
        .map(|c| zstd::bulk::compress(c, ZSTD_LEVEL).unwrap().len())
        .sum();
    raw as f64 / wire as f64
}

#[test]
fn small_chunks_reach_the_target_ratio() {
    // The bench's scaled profile: 594 KiB ledgers in 10 KiB chunks.
    for target in [7.6, 3.0] {
        let spec = SyntheticSpec {
            size: 594 << 10,
            ratio: target,
            count: Some(4),
            chunk: 10 << 10,
            ..SyntheticSpec::default()
        };
        let ledgers: Vec<Vec<u8>> = synthetic_ledgers(&spec).collect();
        let measured = chunked_ratio(&ledgers, 10 << 10);
        assert!(
            (measured / target - 1.0).abs() < 0.05,
            "target {target}, measured {measured:.2} over 10 KiB chunks"
        );
    }
    // And the chain differs from the default chunk's, so two specs never share one.
    let a = synthetic_ledgers(&SyntheticSpec {
        size: MIN_SIZE,
        count: Some(1),
        ..SyntheticSpec::default()
    })
    .next();
    let b = synthetic_ledgers(&SyntheticSpec {
        size: MIN_SIZE,
        count: Some(1),
        chunk: 10 << 10,
        ..SyntheticSpec::default()
    })
    .next();
    assert_ne!(a, b);
}
