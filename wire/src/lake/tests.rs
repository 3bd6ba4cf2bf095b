use super::*;

#[test]
fn names_match_the_worked_examples() {
    // Galexie's defaults, one ledger per batch, 64000 per partition.
    let s = Schema::new(1, 64000).unwrap();
    assert_eq!(
        s.object_key(1_000_000),
        "FFF159FF--960000-1023999/FFF0BDBF--1000000.xdr.zst"
    );
    assert_eq!(
        s.object_key(63_000_123),
        "FC3F0FFF--62976000-63039999/FC3EB1C4--63000123.xdr.zst"
    );
    // SEP-54's own examples: 2 per batch, 8 per partition.
    let s = Schema::new(2, 8).unwrap();
    assert_eq!(s.object_key(18), "FFFFFFEF--16-31/FFFFFFED--18-19.xdr.zst");
    assert_eq!(s.object_key(19), "FFFFFFEF--16-31/FFFFFFED--18-19.xdr.zst");
    assert_eq!(s.object_key(2), "FFFFFFFF--0-15/FFFFFFFD--2-3.xdr.zst");
    assert_eq!(s.object_key(15), "FFFFFFFF--0-15/FFFFFFF1--14-15.xdr.zst");
    assert_eq!(
        Schema::new(1, 2).unwrap().batch_name(2),
        "FFFFFFFD--2.xdr.zst"
    );
    // 50 per batch, 4 per partition.
    let s = Schema::new(50, 4).unwrap();
    assert_eq!(
        s.object_key(250),
        "FFFFFF37--200-399/FFFFFF05--250-299.xdr.zst"
    );
    // One batch per partition: no directory.
    let s = Schema::new(200, 1).unwrap();
    assert_eq!(s.object_key(300), "FFFFFF37--200-399.xdr.zst");
    assert_eq!(s.partition_dir(300), None);
    // The pubnet sample in testdata/, named by an older Galexie.
    let s = Schema::new(1, 1).unwrap().with_extension(Extension::Zstd);
    assert_eq!(s.object_key(53_312_000), "FCD285FF--53312000.xdr.zstd");
    assert_eq!(s.object_key(997), "FFFFFC1A--997.xdr.zstd");
    // The first batch of a network (ledger 2) with 64 per file.
    let s = Schema::new(64, 1000).unwrap();
    assert_eq!(s.batch_range(2), (0, 63));
    assert_eq!(s.object_key(2), "FFFFFFFF--0-63999/FFFFFFFF--0-63.xdr.zst");
    // The last batch of the sequence space is clamped rather than wrapped.
    assert_eq!(
        Schema::new(64, 1).unwrap().batch_range(u32::MAX),
        (u32::MAX - 63, u32::MAX)
    );
    assert_eq!(
        Schema::new(1, 1).unwrap().object_key(u32::MAX),
        "00000000--4294967295.xdr.zst"
    );
}

#[test]
fn bad_layouts_are_refused() {
    assert_eq!(Schema::new(0, 1), Err(SchemaError::ZeroLedgersPerBatch));
    assert_eq!(Schema::new(1, 0), Err(SchemaError::ZeroBatchesPerPartition));
    assert!(matches!(
        Schema::new(1 << 16, 1 << 16),
        Err(SchemaError::PartitionTooLarge { .. })
    ));
}

#[test]
fn names_parse_strictly_and_round_trip() {
    for (name, first, last, ext) in [
        (
            "FFF0BDBF--1000000.xdr.zst",
            1_000_000,
            1_000_000,
            Extension::Zst,
        ),
        ("FFFFFF05--250-299.xdr.zst", 250, 299, Extension::Zst),
        (
            "FCD285FF--53312000.xdr.zstd",
            53_312_000,
            53_312_000,
            Extension::Zstd,
        ),
        ("FFFFFFFF--0.xdr.zst", 0, 0, Extension::Zst),
    ] {
        let got = parse_batch_name(name).unwrap();
        assert_eq!(
            (got.first, got.last, got.extension),
            (first, last, ext),
            "{name}"
        );
        assert_eq!(batch_name(got.first, got.last, got.extension), name);
    }
    for bad in [
        ".config.json",
        "FFF0BDBF--1000000.xdr.gz",
        "fff0bdbf--1000000.xdr.zst",  // lowercase hex
        "FFF0BDBE--1000000.xdr.zst",  // hex disagrees with the decimal
        "FFF0BDBF--01000000.xdr.zst", // leading zero
        "FFF0BDBF-1000000.xdr.zst",
        "FFF0BDB--1000000.xdr.zst",
        "FFFFFF05--250-250.xdr.zst", // a one-ledger range is written without `-N`
        "FFFFFF05--250-249.xdr.zst",
        "FFFFFF05--250-.xdr.zst",
        "FFFFFF05--250-299-300.xdr.zst",
        "FFFFFFFF--99999999999.xdr.zst",
        "FFFFFFFF--+0.xdr.zst",
        "",
    ] {
        assert_eq!(parse_batch_name(bad), None, "{bad:?}");
    }
    assert_eq!(
        parse_partition_name("FFF159FF--960000-1023999"),
        Some((960_000, 1_023_999))
    );
    assert_eq!(parse_partition_name("FFF159FF--960000"), None);
    assert_eq!(parse_partition_name("FFF159FE--960000-1023999"), None);
    // The last partition of the sequence space, clamped to one ledger.
    let s = Schema::new(1, 65535).unwrap();
    let dir = s.partition_dir(u32::MAX).unwrap();
    assert_eq!(dir, "00000000--4294967295-4294967295");
    assert_eq!(parse_partition_name(&dir), Some((u32::MAX, u32::MAX)));
}

#[test]
fn manifest_matches_galexie_and_is_checked() {
    let s = Schema::new(1, 64000).unwrap();
    let m = Manifest::new("Test SDF Network ; September 2015", &s);
    assert_eq!(
        String::from_utf8(m.to_json()).unwrap(),
        r#"{"networkPassphrase":"Test SDF Network ; September 2015","version":"1.0","compression":"zstd","ledgersPerBatch":1,"batchesPerPartition":64000}"#
    );
    assert_eq!(Manifest::parse(&m.to_json()).unwrap(), m);
    assert_eq!(m.schema().unwrap(), s);
    // Unknown fields are ignored, as Go does.
    let extra = br#"{"networkPassphrase":"x","ledgersPerBatch":8,"batchesPerPartition":4,"ledgersPath":"/l"}"#;
    assert_eq!(
        Manifest::parse(extra).unwrap().schema().unwrap(),
        Schema::new(8, 4).unwrap()
    );
    for (bad, want) in [
        (&br#"{"ledgersPerBatch":1"#[..], "not valid json"),
        (br#"[]"#, "not valid json"),
        (
            br#"{"ledgersPerBatch":0,"batchesPerPartition":1}"#,
            "at least 1",
        ),
        (br#"{"ledgersPerBatch":1}"#, "batches per partition"),
        (
            br#"{"compression":"gzip","ledgersPerBatch":1,"batchesPerPartition":1}"#,
            "gzip",
        ),
        (
            br#"{"version":"2.0","ledgersPerBatch":1,"batchesPerPartition":1}"#,
            "2.0",
        ),
        (
            br#"{"ledgersPerBatch":-1,"batchesPerPartition":1}"#,
            "not valid json",
        ),
    ] {
        let e = Manifest::parse(bad).unwrap_err().to_string();
        assert!(e.contains(want), "{}: {e}", String::from_utf8_lossy(bad));
    }
    let long = vec![b' '; MAX_MANIFEST_LEN + 1];
    assert_eq!(
        Manifest::parse(&long),
        Err(ManifestError::TooLong {
            len: MAX_MANIFEST_LEN + 1
        })
    );
}
