//! `dataset`, `for-each`, `row-id` and `matrix` through the binary: files of every format
//! expand to the expected instances and ids, bad files stop everything with a diagnostic
//! naming the file, row and column, ids survive reordering and appending, and the rows reach
//! the agent and the result tables.

use std::path::Path;

use super::*;

/// Writes `files` (path, content) and `suite.kdl` into a fresh directory.
fn project(suite: &str, files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, content) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    std::fs::write(dir.path().join("suite.kdl"), suite).unwrap();
    dir
}

/// `trellis list`'s scenario ids (`suite/ID`), in plan order.
async fn listed(dir: &Path, extra: &[&str]) -> Vec<String> {
    let o = trellis()
        .arg("list")
        .arg(dir.join("suite.kdl"))
        .args(extra)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    stdout(&o)
        .lines()
        .filter(|l| l.starts_with("suite/"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

const AGENT: &str = "agent \"demo\" protocol=\"connexity\" builtin=\"booking\"\n";

/// Types, nulls, unicode and an embedded newline, in CSV.
const ORDERS_CSV: &str = "order_id,status,amount,note\n\
A17,open,12,\"two\nlines, and a comma\"\n\
B02,closed,5,\n\
007,open,2.5,ünïcødé ✓\n";

#[tokio::test]
async fn csv_rows_become_instances_named_by_row_id_with_typed_fields() {
    let suite = format!(
        "{AGENT}dataset \"orders\" path=\"data/orders.csv\" filter=\"{{{{ row.status == 'open' }}}}\"\n\
         scenario \"refund\" for-each=\"orders\" {{\n\
             row-id \"{{{{ row.order_id }}}}\"\n\
             user \"order {{{{ row.order_id }}}} amount {{{{ row.amount + 1 }}}} note {{{{ row.note }}}}\"\n\
             expect no-error\n\
         }}\n"
    );
    let dir = project(&suite, &[("data/orders.csv", ORDERS_CSV.as_bytes())]);
    // The filter dropped the closed order; `007` kept its leading zeros (text), `12` is a
    // number (`+ 1` works on it).
    assert_eq!(
        listed(dir.path(), &[]).await,
        ["suite/refund[A17]", "suite/refund[007]"]
    );

    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let turns = read_parquet(&out.join("turns.parquet"));
    let mut sent: Vec<String> = strings(&turns, "user_message")
        .into_iter()
        .flatten()
        .collect();
    sent.sort();
    assert_eq!(
        sent,
        [
            "order 007 amount 3.5 note ünïcødé ✓",
            "order A17 amount 13 note two\nlines, and a comma",
        ]
    );
    // The results join back to the rows: dataset, row id and the row itself.
    let t = read_parquet(&out.join("trajectories.parquet"));
    let mut rows: Vec<(String, String, String, String)> = strings(&t, "scenario")
        .into_iter()
        .zip(strings(&t, "dataset"))
        .zip(strings(&t, "row_id"))
        .zip(strings(&t, "instance_of"))
        .map(|(((s, d), r), i)| (s.unwrap(), d.unwrap(), r.unwrap(), i.unwrap()))
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            (
                "refund[007]".into(),
                "orders".into(),
                "007".into(),
                "refund".into()
            ),
            (
                "refund[A17]".into(),
                "orders".into(),
                "A17".into(),
                "refund".into()
            ),
        ]
    );
    let row: serde_json::Value = serde_json::from_str(
        strings(&t, "row")
            .into_iter()
            .flatten()
            .find(|r| r.contains("A17"))
            .unwrap()
            .as_str(),
    )
    .unwrap();
    assert_eq!(
        row,
        serde_json::json!({"order_id": "A17", "status": "open", "amount": 12,
                           "note": "two\nlines, and a comma"})
    );
}

/// `row` is in template scope everywhere: an instance's `name` and `description` name its
/// row (the journal's scenario list, and `scenario.name` in what is sent); a field the row
/// lacks is an error naming the row.
#[tokio::test]
async fn an_instances_name_and_description_are_rendered_with_its_row() {
    let suite = format!(
        "{AGENT}dataset \"orders\" path=\"data/orders.csv\" filter=\"{{{{ row.status == 'open' }}}}\"\n\
         scenario \"refund\" for-each=\"orders\" {{\n\
             name \"Refund {{{{ row.order_id }}}}\"\n\
             description \"Order {{{{ row.order_id }}}} of {{{{ row.amount }}}}\"\n\
             row-id \"{{{{ row.order_id }}}}\"\n\
             user \"{{{{ scenario.name }}}}: {{{{ scenario.description }}}}\"\n\
             expect no-error\n\
         }}\n"
    );
    let dir = project(&suite, &[("data/orders.csv", ORDERS_CSV.as_bytes())]);
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let turns = read_parquet(&out.join("turns.parquet"));
    let mut sent: Vec<String> = strings(&turns, "user_message")
        .into_iter()
        .flatten()
        .collect();
    sent.sort();
    assert_eq!(
        sent,
        [
            "Refund 007: Order 007 of 2.5",
            "Refund A17: Order A17 of 12"
        ]
    );
    let journal = journal_text(&out);
    assert!(journal.contains("\"name\":\"Refund A17\""), "{journal}");

    let broken = suite.replace("Refund {{ row.order_id }}", "Refund {{ row.order }}");
    std::fs::write(dir.path().join("suite.kdl"), broken).unwrap();
    let o = check(&dir.path().join("suite.kdl")).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("name:") && err.contains("row 1"), "{err}");
}

#[tokio::test]
async fn jsonl_json_and_parquet_keep_types_nulls_and_nesting() {
    let jsonl = "{\"id\": 1, \"name\": \"Zoë\", \"tags\": [\"a\", \"b\"], \"meta\": {\"vip\": true}, \"note\": null}\n\
                 \n\
                 {\"id\": 2, \"name\": \"李\", \"tags\": [], \"meta\": {\"vip\": false}}\n";
    let json = r#"[{"id": 1, "name": "Zoë", "tags": ["a", "b"], "meta": {"vip": true}, "note": null},
                   {"id": 2, "name": "李", "tags": [], "meta": {"vip": false}}]"#;
    let mut parquet = Vec::new();
    {
        let mut df = df!(
            "id" => [1i64, 2],
            "name" => ["Zoë", "李"],
            "score" => [Some(0.5f64), None],
        )
        .unwrap();
        ParquetWriter::new(&mut parquet).finish(&mut df).unwrap();
    }
    for (file, content, template, expected) in [
        (
            "data/people.jsonl",
            jsonl.as_bytes(),
            "{{ row.name }} vip={{ row.meta.vip }} tags={{ row.tags | length }} note={{ row.note is none }}",
            [
                "Zoë vip=true tags=2 note=true",
                "李 vip=false tags=0 note=true",
            ],
        ),
        (
            "data/people.json",
            json.as_bytes(),
            "{{ row.name }} vip={{ row.meta.vip }} tags={{ row.tags | length }} note={{ row.note is none }}",
            [
                "Zoë vip=true tags=2 note=true",
                "李 vip=false tags=0 note=true",
            ],
        ),
        (
            "data/people.parquet",
            parquet.as_slice(),
            "{{ row.name }} vip={{ row.id > 1 }} tags={{ row.id * 2 }} note={{ row.score is none }}",
            [
                "Zoë vip=false tags=2 note=false",
                "李 vip=true tags=4 note=true",
            ],
        ),
    ] {
        let suite = format!(
            "{AGENT}dataset \"people\" path=\"{file}\"\n\
             scenario \"greet\" for-each=\"people\" {{\n\
                 row-id \"p{{{{ row.id }}}}\"\n\
                 user \"{}\"\n\
                 expect no-error\n\
             }}\n",
            template.replace('"', "\\\"")
        );
        let dir = project(&suite, &[(file, content)]);
        assert_eq!(
            listed(dir.path(), &[]).await,
            ["suite/greet[p1]", "suite/greet[p2]"],
            "{file}"
        );
        let out = dir.path().join("out");
        let o = trellis()
            .arg("run")
            .arg(dir.path().join("suite.kdl"))
            .arg("--out")
            .arg(&out)
            .output()
            .await
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{file}: {}{}",
            stdout(&o),
            stderr(&o)
        );
        let turns = read_parquet(&out.join("turns.parquet"));
        let mut sent: Vec<String> = strings(&turns, "user_message")
            .into_iter()
            .flatten()
            .collect();
        sent.sort();
        let mut expected = expected.to_vec();
        expected.sort();
        assert_eq!(sent, expected, "{file}");
    }
}

/// `show --filter` selects as `run --filter` does: an instance by its scenario's id, and by
/// its own id written out (its `[…]` is no glob class).
#[tokio::test]
async fn show_selects_instances_as_run_does() {
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"d.csv\"\n\
         scenario \"per-row\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    \
         user \"{{{{ row.id }}}}\"\n    \
         expect reply contains=\"NEVER\"\n}}\n\
         scenario \"other\" {{\n    user \"hi\"\n    expect reply contains=\"NEVER\"\n}}\n"
    );
    let dir = project(&suite, &[("d.csv", b"id\nA17\nB-2\n".as_slice())]);
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "suite.kdl", "-q"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let show = |filter: &'static str| {
        let dir = dir.path().to_owned();
        async move {
            let o = trellis()
                .current_dir(dir)
                .args(["show", "--filter", filter])
                .output()
                .await
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            stdout(&o)
        }
    };
    let out = show("per-row").await;
    assert!(out.contains("suite/per-row[A17]"), "{out}");
    assert!(out.contains("suite/per-row[B-2]"), "{out}");
    assert!(!out.contains("suite/other"), "{out}");
    let out = show("per-row[B-2]").await;
    assert!(out.contains("suite/per-row[B-2]"), "{out}");
    assert!(!out.contains("per-row[A17]"), "{out}");
    let out = show("suite/per-row").await;
    assert!(out.contains("suite/per-row[A17]"), "{out}");
}

/// Every bad row of a dataset is said at once, with its line (a field spanning lines moves
/// a row's number away from it), in each format, up to 20: one round of `check` per bad
/// row was the way to find them.
#[tokio::test]
async fn every_bad_row_of_a_dataset_is_said_at_once() {
    let many: String = std::iter::once("id,n\n".to_owned())
        .chain((0..30).map(|i| format!("r{i},{i},extra\n")))
        .collect();
    let suite = format!(
        "{AGENT}dataset \"c\" path=\"c.csv\"\ndataset \"j\" path=\"j.jsonl\"\n\
         dataset \"a\" path=\"a.json\"\ndataset \"m\" path=\"m.csv\"\n\
         scenario \"c\" for-each=\"c\" {{\n    user \"{{{{ row.id }}}}\"\n    expect no-error\n}}\n\
         scenario \"j\" for-each=\"j\" {{\n    user \"{{{{ row.id }}}}\"\n    expect no-error\n}}\n\
         scenario \"a\" for-each=\"a\" {{\n    user \"{{{{ row.id }}}}\"\n    expect no-error\n}}\n\
         scenario \"m\" for-each=\"m\" {{\n    user \"{{{{ row.id }}}}\"\n    expect no-error\n}}\n"
    );
    let dir = project(
        &suite,
        &[
            (
                "c.csv",
                b"id,note\nc1,\"two\nlines\"\nc2,x,y\nc3\nc4,fine\n".as_slice(),
            ),
            ("j.jsonl", b"{\"id\": 1}\nnot json\n[1]\n{\"id\": 2}\n"),
            ("a.json", b"[{\"id\": 1}, 2, {\"id\": 3}, \"x\"]"),
            ("m.csv", many.as_bytes()),
        ],
    );
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    for said in [
        "c.csv): 2 bad rows",
        "- row 2: line 4: 3 fields where the header has 2",
        "- row 3, column `note`: line 5: 1 field where the header has 2",
        "j.jsonl): 2 bad rows",
        "- row 2: line 2: expected ident",
        "- row 3: line 3 is a JSON array, not an object",
        "a.json): 2 bad rows",
        "- row 2: element 2 is a JSON number, not an object",
        "- row 4: element 4 is a JSON string, not an object",
        "m.csv): 20 bad rows (the first; the file may hold more)",
        "- row 20: line 21: 3 fields where the header has 2",
    ] {
        assert!(err.contains(said), "no {said:?} in {err}");
    }
    assert!(!err.contains("row 21:"), "{err}");
}

#[tokio::test]
async fn a_malformed_row_stops_everything_naming_the_file_row_and_column() {
    for (file, content, says) in [
        (
            "data/bad.csv",
            "a,b\n1,2\n3\n4,5\n",
            &["data/bad.csv", "row 2, column `b`: line 3: 1 field"][..],
        ),
        (
            // A quote left open: the `csv` crate reads the rest of the file into the field.
            "data/open.csv",
            "a,b\n1,\"never closed\n2,B\n3,C\n",
            &["data/open.csv", "row 1, column `b`", "never closed"][..],
        ),
        (
            "data/bad.jsonl",
            "{\"a\": 1}\n{\"a\": \n{\"a\": 3}\n",
            &["data/bad.jsonl", "row 2", "line 2"][..],
        ),
        (
            "data/bad.json",
            "[{\"a\": 1}, 7]",
            &["data/bad.json", "row 2", "not an object"][..],
        ),
        (
            "data/missing.csv",
            "",
            &["data/missing.csv", "cannot read"][..],
        ),
        (
            "data/bad.xlsx",
            "x",
            &["unknown dataset format `.xlsx`"][..],
        ),
    ] {
        let suite = format!(
            "{AGENT}dataset \"d\" path=\"{file}\"\n\
             scenario \"s\" for-each=\"d\" {{\n    user \"hi\"\n    expect no-error\n}}\n"
        );
        // The missing file is not written.
        let files: Vec<(&str, &[u8])> = if file.contains("missing") {
            Vec::new()
        } else {
            vec![(file, content.as_bytes())]
        };
        let dir = project(&suite, &files);
        for command in ["check", "run"] {
            let mut cmd = trellis();
            cmd.arg(command).arg(dir.path().join("suite.kdl"));
            if command == "run" {
                cmd.arg("--out").arg(dir.path().join("out"));
            }
            let o = cmd.output().await.unwrap();
            let err = flat(&stderr(&o));
            assert_eq!(o.status.code(), Some(2), "{command} {file}: {err}");
            for s in says {
                assert!(err.contains(s), "{command} {file}: no {s:?} in {err}");
            }
            assert!(
                !dir.path().join("out").exists(),
                "{command} {file}: something ran"
            );
        }
    }
}

/// Parquet files damaged on disk (three bytes of a good file changed) on which polars'
/// decoder panics: each is the dataset's diagnostic, exit 2, nothing run, no panic printed.
#[tokio::test]
async fn a_damaged_parquet_dataset_is_a_diagnostic_not_a_crash() {
    for fixture in ["footer-offsets.parquet", "footer-statistics.parquet"] {
        let content = std::fs::read(Path::new("tests/fixtures/damaged").join(fixture)).unwrap();
        let suite = format!(
            "{AGENT}dataset \"d\" path=\"data/d.parquet\"\n\
             scenario \"s\" for-each=\"d\" {{\n    user \"hi\"\n    expect no-error\n}}\n"
        );
        let dir = project(&suite, &[("data/d.parquet", content.as_slice())]);
        for command in ["check", "run"] {
            let mut cmd = trellis();
            cmd.arg(command).arg(dir.path().join("suite.kdl"));
            if command == "run" {
                cmd.arg("--out").arg(dir.path().join("out"));
            }
            let o = cmd.output().await.unwrap();
            let err = flat(&stderr(&o));
            assert_eq!(o.status.code(), Some(2), "{command} {fixture}: {err}");
            for s in [
                "suite.kdl:2:",
                "data/d.parquet): not a readable Parquet file",
                "write it again from its source",
            ] {
                assert!(err.contains(s), "{command} {fixture}: no {s:?} in {err}");
            }
            assert!(!err.contains("panicked"), "{command} {fixture}: {err}");
            assert!(
                !dir.path().join("out").exists(),
                "{command} {fixture}: something ran"
            );
        }
    }
}

#[tokio::test]
async fn hashed_row_ids_survive_reordering_and_appending() {
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.jsonl\"\n\
         scenario \"s\" for-each=\"d\" {{\n    user \"{{{{ row.q }}}}\"\n    expect no-error\n}}\n"
    );
    let rows = [
        "{\"q\": \"one\", \"n\": 1}",
        "{\"n\": 2, \"q\": \"two\"}",
        "{\"q\": \"three\", \"n\": 3}",
    ];
    let first = project(&suite, &[("data/d.jsonl", rows.join("\n").as_bytes())]);
    let ids = listed(first.path(), &[]).await;
    assert_eq!(ids.len(), 3);
    assert!(
        ids.iter().all(|id| id.len() == "suite/s[".len() + 12 + 1),
        "{ids:?}"
    );

    // Reordered, one row's keys reordered, one appended: the three keep their ids.
    let reordered = format!(
        "{}\n{}\n{{\"n\": 1, \"q\": \"one\"}}\n{{\"q\": \"four\", \"n\": 4}}\n",
        rows[2], rows[1]
    );
    let second = project(&suite, &[("data/d.jsonl", reordered.as_bytes())]);
    let again = listed(second.path(), &[]).await;
    assert_eq!(again.len(), 4);
    for id in &ids {
        assert!(again.contains(id), "{id} lost in {again:?}");
    }
    // An edited row is another row.
    let edited = rows.join("\n").replace("three", "THREE");
    let third = project(&suite, &[("data/d.jsonl", edited.as_bytes())]);
    let changed = listed(third.path(), &[]).await;
    assert_eq!(changed.iter().filter(|id| ids.contains(id)).count(), 2);
}

#[tokio::test]
async fn filter_sample_limit_and_the_filter_flag_select_rows_and_instances() {
    let rows: String = (1..=50)
        .map(|i| format!("{{\"n\": {i}, \"even\": {}}}\n", i % 2 == 0))
        .collect();
    let suite = |props: &str| {
        format!(
            "{AGENT}dataset \"d\" path=\"data/d.jsonl\" {props}\n\
             scenario \"s\" for-each=\"d\" {{\n    row-id \"n{{{{ row.n }}}}\"\n    user \"hi\"\n    expect no-error\n}}\n"
        )
    };
    let files = [("data/d.jsonl", rows.as_bytes())];
    let ids = |v: Vec<String>| -> Vec<String> {
        v.into_iter()
            .map(|s| s.trim_start_matches("suite/").to_string())
            .collect()
    };
    let dir = project(
        &suite("filter=\"{{ row.even and row.n > 40 }}\" limit=3"),
        &files,
    );
    assert_eq!(
        ids(listed(dir.path(), &[]).await),
        ["s[n42]", "s[n44]", "s[n46]"]
    );

    // A sample is the same rows whatever their order in the file.
    let dir = project(&suite("sample=5 seed=7"), &files);
    let sample = ids(listed(dir.path(), &[]).await);
    assert_eq!(sample.len(), 5);
    let reversed: String = rows.lines().rev().map(|l| format!("{l}\n")).collect();
    let dir2 = project(
        &suite("sample=5 seed=7"),
        &[("data/d.jsonl", reversed.as_bytes())],
    );
    let mut again = ids(listed(dir2.path(), &[]).await);
    let mut sorted = sample.clone();
    again.sort();
    sorted.sort();
    assert_eq!(again, sorted);
    let dir3 = project(&suite("sample=5 seed=8"), &files);
    assert_ne!(ids(listed(dir3.path(), &[]).await), sample);

    // `--filter`: an instance by its id as written (brackets and all), by a glob, and every
    // instance by the scenario's id.
    let dir = project(&suite("limit=12"), &files);
    assert_eq!(
        ids(listed(dir.path(), &["--filter", "s[n3]"]).await),
        ["s[n3]"]
    );
    assert_eq!(
        ids(listed(dir.path(), &["--filter", "s[[]n1?]"]).await),
        ["s[n10]", "s[n11]", "s[n12]"]
    );
    assert_eq!(listed(dir.path(), &["--filter", "s"]).await.len(), 12);
}

#[tokio::test]
async fn row_id_problems_name_the_row() {
    // Row 5 is row 2's `café` with a combining accent: the same id, compared in NFC.
    let rows = "{\"id\": \"a\"}\n{\"id\": \"caf\u{e9}\"}\n{\"id\": \"a\"}\n{\"other\": 1}\n{\"id\": \"cafe\u{301}\"}\n";
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.jsonl\"\n\
         scenario \"s\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    user \"{{{{ row.idd }}}}\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[("data/d.jsonl", rows.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    // A column no row has is found by `check` against the dataset's columns.
    assert!(
        err.contains("undefined template variable `row.idd`"),
        "{err}"
    );
    assert!(err.contains("did you mean `row.id`?"), "{err}");

    let suite = suite.replace("row.idd", "row.id");
    let dir = project(&suite, &[("data/d.jsonl", rows.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("row 3 of dataset `d`: row id `a` is also row 1's"),
        "{err}"
    );
    // Row 4 has no `id`: it is `null` there (the row lacks a column another row has).
    assert!(err.contains("row 4 of dataset `d`: row-id failed"), "{err}");
    assert!(
        err.contains("row 5 of dataset `d`: row id `caf\u{e9}` is also row 2's"),
        "{err}"
    );
    assert!(err.contains("is null in this row"), "{err}");
    // Each problem gets the help that fits it: not the id it already uses.
    assert!(err.contains("two rows give this id"), "{err}");
    assert!(!err.contains("e.g. \"{{ row.id }}\""), "{err}");

    // An unknown dataset, with one declared: the closest, or how to declare it.
    let suite = suite.replace("for-each=\"d\"", "for-each=\"tickets\"");
    let dir = project(&suite, &[("data/d.jsonl", rows.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("expected one of the datasets: `d`. Or declare it with"),
        "{err}"
    );

    // A row-id reading a column no row has: said once against the columns, and its failure
    // on each of 500 rows shown for the first few, the rest counted.
    let many: String = (0..500)
        .map(|i| format!("{{\"id\": \"r{i}\"}}\n"))
        .collect();
    let suite = suite
        .replace("for-each=\"tickets\"", "for-each=\"d\"")
        .replace("row-id \"{{ row.id }}\"", "row-id \"{{ row.idd }}\"");
    let dir = project(&suite, &[("data/d.jsonl", many.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("1 error in suite files"), "{err}");
    assert!(err.contains("did you mean `row.id`?"), "{err}");

    // A column some rows lack: each failing row is a mistake of the data, the first few
    // shown and the rest counted.
    let gaps: String = (0..500)
        .map(|i| {
            if i % 100 == 0 {
                format!("{{\"id\": \"r{i}\", \"idd\": \"x{i}\"}}\n")
            } else {
                format!("{{\"id\": \"r{i}\"}}\n")
            }
        })
        .collect();
    let dir = project(&suite, &[("data/d.jsonl", gaps.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("4 errors in suite files"), "{err}");
    assert!(
        err.contains("row-id failed for 492 more rows of dataset `d` (495 of its 500 rows in all)"),
        "{err}"
    );
}

#[tokio::test]
async fn a_matrix_past_the_instance_limit_is_an_error_not_a_crash() {
    // Eight variables of ten values: 100,000,000 instances, built before this check (and
    // every byte of memory taken) before it was counted first.
    let vars: String = (0..8)
        .map(|i| format!("        v{i} 0 1 2 3 4 5 6 7 8 9\n"))
        .collect();
    let suite = format!(
        "{AGENT}scenario \"m\" {{\n    matrix {{\n{vars}    }}\n    user \"hi\"\n    \
         expect no-error\n}}\n"
    );
    let dir = project(&suite, &[]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("scenario `m` has 100000000 instances (at most 100000)"),
        "{said}"
    );
    assert!(said.contains("suite.kdl:"), "{said}");
}

/// Matrix values that an instance id writes the same (`1` and `"1"`) would be one instance,
/// the other never run: an error at the repeat, not a silent drop.
#[tokio::test]
async fn matrix_values_that_read_the_same_are_an_error() {
    let suite = format!(
        "{AGENT}scenario \"m\" {{\n    matrix {{\n        n 1 \"1\" 2\n    }}\n    user \"hi\"\n    \
         expect no-error\n}}\n"
    );
    let dir = project(&suite, &[]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("matrix value `1` of `n` is given twice"),
        "{said}"
    );
    assert!(said.contains("suite.kdl:"), "{said}");
}

#[tokio::test]
async fn matrix_values_are_vars_and_name_the_instances() {
    let suite = format!(
        "{AGENT}scenario \"m\" {{\n\
             matrix {{\n        tone \"polite\" \"curt\"\n        n 1 2\n    }}\n\
             user \"{{{{ vars.tone }}}} {{{{ vars.n + 1 }}}}\"\n\
             expect no-error\n\
         }}\n"
    );
    let dir = project(&suite, &[]);
    assert_eq!(
        listed(dir.path(), &[]).await,
        [
            "suite/m[tone=polite,n=1]",
            "suite/m[tone=polite,n=2]",
            "suite/m[tone=curt,n=1]",
            "suite/m[tone=curt,n=2]"
        ]
    );
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let turns = read_parquet(&out.join("turns.parquet"));
    let mut sent: Vec<String> = strings(&turns, "user_message")
        .into_iter()
        .flatten()
        .collect();
    sent.sort();
    assert_eq!(sent, ["curt 2", "curt 3", "polite 2", "polite 3"]);
    let t = read_parquet(&out.join("trajectories.parquet"));
    assert!(
        strings(&t, "matrix").contains(&Some(r#"{"n":2,"tone":"curt"}"#.to_string())),
        "{:?}",
        strings(&t, "matrix")
    );
}

/// The agents' side-by-side grids (console and report) list scenarios in plan order, a
/// matrix's instances as the matrix lists its values, not as their ids sort as text
/// (`m[n=-3]` before `m[n=10]`), and both grids the same way.
#[tokio::test]
async fn the_agents_grids_keep_the_matrix_order() {
    let dir = project(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         agent \"b\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"zeta\" {\n    agents \"a\" \"b\"\n    user \"Hi\"\n    expect no-error\n}\n\
         scenario \"m\" {\n    agents \"a\" \"b\"\n    matrix {\n        n 2 10 -3\n    }\n    \
         user \"Hi {{ vars.n }}\"\n    expect no-error\n}\n",
        &[],
    );
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let expected = ["zeta", "m[n=2]", "m[n=10]", "m[n=-3]"];
    let console = stdout(&o);
    let grid = &console[console
        .find("suite: agents side by side")
        .unwrap_or_else(|| panic!("no grid in {console}"))..];
    let rows: Vec<&str> = grid
        .lines()
        .filter_map(|l| {
            expected
                .iter()
                .copied()
                .find(|id| l.contains(&format!(" {id} ")))
        })
        .take(expected.len())
        .collect();
    assert_eq!(rows, expected, "{grid}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let grid = &html[html
        .find("<h2>Agents side by side: suite</h2>")
        .unwrap_or_else(|| panic!("no grid in the report"))..];
    let grid = &grid[..grid.find("</table>").unwrap()];
    let mut found: Vec<(usize, &str)> = expected
        .iter()
        .map(|id| (grid.find(&format!("title=\"{id}\"")).unwrap(), *id))
        .collect();
    found.sort();
    let rows: Vec<&str> = found.into_iter().map(|(_, id)| id).collect();
    assert_eq!(rows, expected);
}

/// Model names and URLs hold `/`, and are what a matrix is most often over: such a value
/// names its instance (`m[model=openai/gpt-4o-mini]`), is selected by `--filter`, and a
/// scenario that `needs` the matrix waits for each instance. 7c52210 refused them.
#[tokio::test]
async fn matrix_values_with_a_slash_name_instances_that_filters_and_needs_reach() {
    let suite = format!(
        "{AGENT}scenario \"m\" {{\n\
             matrix {{\n        model \"openai/gpt-4o-mini\" \"meta/llama-3\"\n    }}\n\
             user \"{{{{ vars.model }}}}\"\n\
             expect no-error\n\
         }}\n\
         scenario \"after\" {{\n    needs \"m\"\n    user \"hi\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[]);
    assert_eq!(
        listed(dir.path(), &[]).await,
        [
            "suite/m[model=openai/gpt-4o-mini]",
            "suite/m[model=meta/llama-3]",
            "suite/after",
        ]
    );
    assert_eq!(
        listed(dir.path(), &["--filter", "m[model=meta/llama-3]"]).await,
        ["suite/m[model=meta/llama-3]"]
    );
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let t = read_parquet(&out.join("trajectories.parquet"));
    let statuses: Vec<Option<String>> = strings(&t, "status");
    assert_eq!(statuses.len(), 3, "{t}");
    assert!(
        statuses.iter().all(|s| s.as_deref() == Some("passed")),
        "{t}"
    );
}

/// Ids are compared in NFC: a filter typed in NFD (a macOS terminal's `ü`, `u` and a
/// combining diaeresis) selects the scenario written precomposed, and its instances.
#[tokio::test]
async fn a_filter_typed_in_nfd_selects_the_id_written_in_nfc() {
    let suite = format!(
        "{AGENT}scenario \"grüße\" {{\n    user \"hi\"\n    expect no-error\n}}\n\
         scenario \"m\" {{\n    matrix {{\n        w \"über\" \"x\"\n    }}\n    \
         user \"{{{{ vars.w }}}}\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[]);
    assert_eq!(
        listed(dir.path(), &["--filter", "gru\u{308}ße"]).await,
        ["suite/grüße"]
    );
    assert_eq!(
        listed(dir.path(), &["--filter", "m[w=u\u{308}ber]"]).await,
        ["suite/m[w=über]"]
    );
    assert_eq!(
        listed(dir.path(), &["--filter", "gru\u{308}*"]).await,
        ["suite/grüße"]
    );
    // A suite is named after its file, which macOS names in NFD: either spelling of
    // `müll/s` selects it.
    std::fs::write(
        dir.path().join("mu\u{308}ll.kdl"),
        "scenario \"s\" {\n    agent \"demo\"\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    for filter in ["mu\u{308}ll/s", "müll/s", "mu\u{308}ll/*"] {
        let o = trellis()
            .arg("list")
            .arg(dir.path())
            .args(["--filter", filter])
            .output()
            .await
            .unwrap();
        let listed: Vec<String> = stdout(&o)
            .lines()
            .filter(|l| l.starts_with("m"))
            .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
            .collect();
        assert_eq!(listed.len(), 1, "{filter}: {}{}", stdout(&o), stderr(&o));
    }
}

/// The `messages` a Connexity agent received in each request, in order.
fn received(server: &support::MisbehavingServer) -> Vec<Vec<(String, String)>> {
    server
        .recorded()
        .iter()
        .map(|r| {
            r.json()["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m["role"].as_str().unwrap_or_default().to_string(),
                        m["content"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(r, c)| (r.to_string(), c.to_string()))
        .collect()
}

#[tokio::test]
async fn a_history_from_a_column_or_a_file_reaches_the_agent_as_history() {
    let server = support::MisbehavingServer::respond(200, support::OK_BODY).await;
    // A list in JSON Lines; JSON text in a CSV column (with an embedded newline).
    let jsonl = r#"{"id": "j1", "messages": [{"role": "system", "content": "ignored"}, {"role": "user", "content": "my order is late"}, {"role": "assistant", "content": [{"type": "text", "text": "Sorry! Which order?"}]}]}"#;
    // (The field spans two lines of the file; the message's own line break is JSON's `\n`.)
    let csv = "id,messages\nc1,\"[{\"\"role\"\": \"\"user\"\", \"\"content\"\": \"\"two\\nlines\"\"},\n{\"\"role\"\": \"\"assistant\"\", \"\"content\"\": \"\"ok\"\"}]\"\n";
    let conv = r#"{"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi, how can I help?"}, {"role": "user", "content": "where is my refund?"}]}"#;
    let suite = format!(
        "agent \"a\" protocol=\"connexity\" url=\"{url}\"\n\
         dataset \"j\" path=\"data/c.jsonl\"\n\
         dataset \"c\" path=\"data/c.csv\"\n\
         scenario \"from-jsonl\" for-each=\"j\" {{\n    row-id \"{{{{ row.id }}}}\"\n    history \"{{{{ row.messages }}}}\"\n    user \"It is A17\"\n    expect no-error\n}}\n\
         scenario \"from-csv\" for-each=\"c\" {{\n    row-id \"{{{{ row.id }}}}\"\n    history \"{{{{ row.messages }}}}\"\n    user \"next\"\n    expect no-error\n}}\n\
         scenario \"from-file\" {{\n    history path=\"conv.json\"\n    expect no-error\n    user \"thanks\"\n    expect no-error\n}}\n",
        url = server.url()
    );
    let dir = project(
        &suite,
        &[
            ("data/c.jsonl", jsonl.as_bytes()),
            ("data/c.csv", csv.as_bytes()),
            ("conv.json", conv.as_bytes()),
        ],
    );
    for filter in ["from-jsonl", "from-csv", "from-file"] {
        let o = trellis()
            .arg("run")
            .arg(dir.path().join("suite.kdl"))
            .args(["--filter", filter, "--out"])
            .arg(dir.path().join(format!("out-{filter}")))
            .output()
            .await
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{filter}: {}{}",
            stdout(&o),
            stderr(&o)
        );
    }
    let got = received(&server);
    assert_eq!(
        got,
        [
            // The history is not sent by itself: it is the opening of the first request.
            pairs(&[
                ("user", "my order is late"),
                ("assistant", "Sorry! Which order?"),
                ("user", "It is A17"),
            ]),
            pairs(&[
                ("user", "two\nlines"),
                ("assistant", "ok"),
                ("user", "next")
            ]),
            // A last user message without an answer is the trajectory's first turn, and
            // the conversation goes on from the agent's answer to it.
            pairs(&[
                ("user", "hello"),
                ("assistant", "hi, how can I help?"),
                ("user", "where is my refund?"),
            ]),
            pairs(&[
                ("user", "hello"),
                ("assistant", "hi, how can I help?"),
                ("user", "where is my refund?"),
                ("assistant", "Hello there."),
                ("user", "thanks"),
            ]),
        ]
    );
}

#[tokio::test]
async fn a_session_bound_agent_gets_the_history_replayed_user_turn_by_user_turn() {
    let conv = r#"[{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And in Oslo?"}, {"role": "assistant", "content": "Rain."}]"#;
    let suite = "agent \"w\" protocol=\"agentscope\" builtin=\"weather\"\n\
                 scenario \"s\" {\n    history path=\"conv.json\"\n    max-turns 1\n    criteria {\n        turns max=1\n    }\n    user \"And tomorrow?\"\n    expect no-error\n}\n";
    let dir = project(suite, &[("conv.json", conv.as_bytes())]);
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let turns = read_parquet(&out.join("turns.parquet"));
    let sent: Vec<String> = strings(&turns, "user_message")
        .into_iter()
        .flatten()
        .collect();
    let replay: Vec<bool> = turns
        .column("replay")
        .unwrap()
        .bool()
        .unwrap()
        .iter()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(sent, ["Weather in Paris?", "And in Oslo?", "And tomorrow?"]);
    assert_eq!(replay, [true, true, false]);
    // The replayed history did not happen in this run: `max-turns 1` and `turns max=1` see
    // the one turn after it, as on a protocol that resends the history.
    let trajectories = read_parquet(&out.join("trajectories.parquet"));
    let counted: Vec<u32> = trajectories
        .column("turns")
        .unwrap()
        .u32()
        .unwrap()
        .iter()
        .map(|n| n.unwrap())
        .collect();
    assert_eq!(counted, [1]);
}

/// report.html shows an instance's row and the history its trajectories opened with,
/// escaped, so a reviewer sees the case and not only the user messages.
#[tokio::test]
async fn the_report_shows_an_instances_row_and_history() {
    let jsonl = "{\"id\": \"A1\", \"note\": \"<b>bold</b>\", \"m\": [{\"role\": \"user\", \"content\": \"I ordered a LAMP-7\"}, \
                 {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"lookup_order\", \"arguments\": \"{}\"}}]}, \
                 {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"found\"}, {\"role\": \"assistant\", \"content\": \"Which order?\"}]}\n";
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.jsonl\"\n\
         scenario \"r\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    history \"{{{{ row.m }}}}\"\n    \
         user \"It is A1\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[("data/d.jsonl", jsonl.as_bytes())]);
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("dataset d, row id A1"), "no row source");
    assert!(
        html.contains("&lt;b&gt;bold&lt;&#x2f;b&gt;"),
        "the row's note, escaped"
    );
    assert!(!html.contains("<b>bold</b>"));
    assert!(
        html.contains("<span class=\"meta\">user:</span> I ordered a LAMP-7"),
        "no history"
    );
    // A turn of tool calls has no text: the tools it called stand for it.
    assert!(
        html.contains("<span class=\"meta\">assistant:</span> [calls lookup_order]"),
        "no tool call in the history"
    );
}

#[tokio::test]
async fn a_bad_history_is_an_error_naming_the_row() {
    let jsonl = "{\"m\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n{\"m\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n\
                 {\"m\": \"  \"}\n{\"m\": [{\"role\": \"user\", \"content\": \" \"}]}\n{\"m\": []}\n\
                 {\"m\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}, {\"role\": \"assistant\", \"content\": \"A cat.\"}]}\n";
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.jsonl\"\n\
         scenario \"s\" for-each=\"d\" {{\n    history \"{{{{ row.m }}}}\"\n    user \"x\"\n    expect no-error\n}}\n\
         scenario \"f\" {{\n    history path=\"nope.json\"\n    user \"x\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[("data/d.jsonl", jsonl.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("row 2 of dataset `d`: invalid history: message 1 has role `robot`"),
        "{err}"
    );
    assert!(
        err.contains("scenario `f`: invalid history: cannot read `nope.json`"),
        "{err}"
    );
    // Empty text is no message to send, whether a cell or a message's content.
    assert!(
        err.contains("row 3 of dataset `d`: invalid history: `{{ row.m }}` is empty"),
        "{err}"
    );
    assert!(
        err.contains("row 4 of dataset `d`: invalid history: message 1 (user) has no text"),
        "{err}"
    );
    // `[]`, and a message holding only an image, are histories.
    assert!(!err.contains("row 5 "), "{err}");
    assert!(!err.contains("row 6 "), "{err}");
}

#[tokio::test]
async fn a_problem_every_row_shares_is_said_once_with_a_count() {
    let csv = "id,amount,m\n1,5,\n2,6,\n3,7,\n";
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.csv\"\n\
         scenario \"s\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    \
         user-context {{\n        amt \"{{{{ row.amout }}}}\"\n    }}\n    user \"x\"\n    expect no-error\n}}\n\
         scenario \"h\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    history \"{{{{ row.m }}}}\"\n    \
         user \"x\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[("data/d.csv", csv.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("2 errors in suite files"), "{err}");
    assert!(
        err.contains("scenario `s`, row 1 of dataset `d` (and 2 more instances): user-context"),
        "{err}"
    );
    assert!(
        err.contains(
            "scenario `h[1]`, row 1 of dataset `d` (and 2 more instances): invalid history"
        ),
        "{err}"
    );
    assert!(
        err.contains("`{{ row.amout }}` is undefined: did you mean `row.amount`?"),
        "{err}"
    );
}

/// Every row-templated field of a `for-each` scenario with a typo is said at once (it
/// took a save per field: the first error of an instance stopped the rest), each with
/// the column it most likely meant.
#[tokio::test]
async fn every_row_field_typo_of_an_instance_is_said_at_once() {
    let csv = "order_id,status,amount
A1,open,10
A2,closed,20
";
    let suite = format!(
        "{AGENT}dataset \"orders\" path=\"data/orders.csv\"\n\
         scenario \"s\" for-each=\"orders\" {{\n    row-id \"{{{{ row.order_id }}}}\"\n    \
         name \"Order {{{{ row.statuss }}}}\"\n    description \"Amount {{{{ row.amout }}}}\"\n    \
         user-context {{\n        amt \"{{{{ row.amountt }}}}\"\n    }}\n    \
         user \"hi\"\n    expect no-error\n    expect outcome \"paid {{{{ row.amuont }}}}\"\n}}\n"
    );
    let dir = project(&suite, &[("data/orders.csv", csv.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    // The outcome's typo once, where it is written (it was said a second time, at the
    // scenario's name, as every instance's).
    assert!(err.contains("4 errors in suite files"), "{err}");
    assert!(
        err.contains("undefined template variable `row.amuont`"),
        "{err}"
    );
    assert!(!err.contains("judge statement:"), "{err}");
    for said in [
        "name: `{{ row.statuss }}` is undefined: did you mean `row.status`?",
        "description: `{{ row.amout }}` is undefined: did you mean `row.amount`?",
        "`amt`: `{{ row.amountt }}` is undefined: did you mean `row.amount`?",
    ] {
        assert!(err.contains(said), "{said}: {err}");
    }
}

#[tokio::test]
async fn imported_conversations_run_from_their_history() {
    let server = support::MisbehavingServer::respond(200, support::OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("exports/conv.jsonl");
    std::fs::create_dir_all(export.parent().unwrap()).unwrap();
    std::fs::write(
        &export,
        "{\"id\": \"t1\", \"messages\": [{\"role\": \"user\", \"content\": \"where is my refund?\"}]}\n\
         {\"id\": \"t2\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}, {\"role\": \"user\", \"content\": \"cancel it\"}]}\n",
    )
    .unwrap();
    let suite = dir.path().join("suites/conv.kdl");
    let o = trellis()
        .args(["import", "conversations"])
        .arg(&export)
        .arg("--out")
        .arg(&suite)
        .args(["--agent-url", &server.url()])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&suite).unwrap();
    assert!(text.contains("path=\"../exports/conv.jsonl\""), "{text}");
    assert!(text.contains("history \"{{ row.messages }}\""), "{text}");
    // Written once: again without --replace is refused and changes nothing.
    let again = trellis()
        .args(["import", "conversations"])
        .arg(&export)
        .arg("--out")
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(stderr(&again).contains("--replace"), "{}", stderr(&again));

    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("conversation[t2]"), "{}", stdout(&o));
    let mut got = received(&server);
    got.sort();
    assert_eq!(
        got,
        [
            pairs(&[
                ("user", "hi"),
                ("assistant", "Hello!"),
                ("user", "cancel it")
            ]),
            pairs(&[("user", "where is my refund?")]),
        ]
    );

    // A line that is not a conversation names the line.
    std::fs::write(&export, "{\"messages\": []}\n[1]\n").unwrap();
    let o = trellis()
        .args(["import", "conversations"])
        .arg(&export)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("line 2: not an object"),
        "{}",
        stderr(&o)
    );
}

/// An export as Windows tools write it (a byte order mark), with ids that differ only in
/// whitespace, and a conversation that ends with the agent's answer: it imports, and the
/// conversation that runs no turn is skipped, never passed on `no-error` alone.
#[tokio::test]
async fn imported_conversations_with_a_bom_odd_ids_and_no_turn_to_run() {
    let server = support::MisbehavingServer::respond(200, support::OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("conv.jsonl");
    std::fs::write(
        &export,
        "\u{feff}{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\r\n\
         {\"id\": \"a \", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}]}\r\n",
    )
    .unwrap();
    let suite = dir.path().join("conv.kdl");
    let o = trellis()
        .args(["import", "conversations"])
        .arg(&export)
        .arg("--out")
        .arg(&suite)
        .args(["--agent-url", &server.url()])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&suite).unwrap();
    assert!(
        !text.contains("row-id"),
        "ids not unique once trimmed: {text}"
    );
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let t = read_parquet(&out.join("trajectories.parquet"));
    let mut status: Vec<_> = strings(&t, "status").into_iter().flatten().collect();
    status.sort();
    assert_eq!(status, ["passed", "skipped"], "{}", stdout(&o));
    assert_eq!(received(&server).len(), 1);
}

#[tokio::test]
async fn compare_takes_two_agents_of_one_run_scenario_by_scenario() {
    let server = support::MisbehavingServer::respond(200, support::OK_BODY).await;
    let suite = format!(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         agent \"b\" protocol=\"connexity\" url=\"{}\"\n\
         dataset \"d\" path=\"data/d.jsonl\"\n\
         scenario \"ask\" for-each=\"d\" {{\n    agents \"a\" \"b\"\n    row-id \"{{{{ row.id }}}}\"\n    user \"{{{{ row.q }}}}\"\n    expect reply contains=\"postal code\"\n}}\n",
        server.url()
    );
    let rows = "{\"id\": \"x\", \"q\": \"Hi, I want a duct cleaning\"}\n{\"id\": \"y\", \"q\": \"Book me\"}\n";
    let dir = project(&suite, &[("data/d.jsonl", rows.as_bytes())]);
    let run = dir.path().join("runs/side-by-side");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&run)
        .output()
        .await
        .unwrap();
    // `b` answers "Hello there.": it fails where `a` asks for the postal code.
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    // The console sets the agents side by side, one row per instance.
    let console = stdout(&o);
    let grid = &console[console
        .find("suite: agents side by side (pass rate, 95% CI)")
        .unwrap_or_else(|| panic!("no grid in {console}"))..];
    let row = grid.lines().find(|l| l.contains("ask[x]")).unwrap();
    assert!(
        row.contains("100% (21–100%)") && row.contains("0% (0–79%)"),
        "{grid}"
    );
    // So does the report.
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    let grid = &html[html
        .find("<h2>Agents side by side: suite</h2>")
        .unwrap_or_else(|| panic!("no grid in the report"))..];
    let row = &grid[grid.find("title=\"ask[x]\"").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains("rate-all\" title=\"95% CI 21–100%\">100.0%")
            && row.contains("rate-none\" title=\"95% CI 0–79%\">0.0%"),
        "{row}"
    );
    let compare = |agents: [&str; 2]| {
        let mut cmd = trellis();
        cmd.arg("compare")
            .arg(&run)
            .args(["--json", "--agents", agents[0], agents[1]]);
        cmd
    };
    let o = compare(["a", "b"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let c: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let scenarios: Vec<(String, String)> = c["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["scenario"].as_str().unwrap().to_string(),
                s["rate"]["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        scenarios,
        [
            ("ask[x]".to_string(), "regressed".to_string()),
            ("ask[y]".to_string(), "regressed".to_string())
        ],
        "{c}"
    );
    // The other way round only the pass rate is judged: the builtin `a` answers in-process
    // while `b` is a canned server, so on a loaded machine `a`'s latency alone would be a
    // regression.
    let o = compare(["b", "a"])
        .args(["--latency-noise-ms", "60000"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let o = compare(["a", "nobody"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no trajectory of agent `nobody`"),
        "{}",
        stderr(&o)
    );
}

/// A check's text that is a missing or `null` JSON Lines field is no text: an error
/// ("nothing was checked"), as an empty CSV cell is. It rendered the word `null`, so
/// `not-contains` passed on every reply.
#[tokio::test]
async fn a_check_text_that_is_a_null_field_checks_nothing() {
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.jsonl\"\n\
         scenario \"s\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    \
         user \"hi\"\n    expect reply not-contains=\"{{{{ row.bad }}}}\"\n}}\n\
         scenario \"e\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    \
         user \"hi\"\n    expect reply equals=\"{{{{ row.bad }}}}\"\n}}\n"
    );
    let dir = project(
        &suite,
        &[(
            "data/d.jsonl",
            b"{\"id\": \"set\", \"bad\": \"zzz-never-said\"}\n{\"id\": \"missing\"}\n{\"id\": \"null\", \"bad\": null}\n",
        )],
    );
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let t = read_parquet(&out.join("trajectories.parquet"));
    let scenarios = strings(&t, "scenario");
    let statuses = strings(&t, "status");
    let status_of = |id: &str| {
        scenarios
            .iter()
            .position(|s| s.as_deref() == Some(&format!("s[{id}]")))
            .and_then(|i| statuses[i].clone())
    };
    assert_eq!(status_of("set").as_deref(), Some("passed"), "{t}");
    assert_eq!(status_of("missing").as_deref(), Some("error"), "{t}");
    assert_eq!(status_of("null").as_deref(), Some("error"), "{t}");
    // Whatever the check: `equals` compared with the empty text (an empty reply passed).
    for id in ["e[missing]", "e[null]"] {
        let i = scenarios.iter().position(|s| s.as_deref() == Some(id));
        let status = i.and_then(|i| statuses[i].as_deref());
        assert_eq!(status, Some("error"), "{id}: {t}");
    }
    let c = read_parquet(&out.join("criteria.parquet"));
    assert!(
        strings(&c, "detail")
            .iter()
            .flatten()
            .any(|d| d.contains("nothing was checked")),
        "{c}"
    );
}

/// A filter reading a column the file's header does not have is an error at the name, with
/// the column meant, not a failure of the first row; the scenarios over the dataset are
/// still checked against its columns (the filter's error hid theirs).
#[tokio::test]
async fn a_filter_on_a_column_the_header_lacks_is_said_where_it_is_written() {
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.csv\" filter=\"{{{{ row.statuz == 'open' }}}}\"\n\
         scenario \"s\" for-each=\"d\" {{\n    user \"hi {{{{ row.idd }}}}\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[("data/d.csv", b"id,status\n1,open\n2,closed\n")]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("undefined template variable `row.statuz`"),
        "{err}"
    );
    assert!(err.contains("suite.kdl:2:"), "{err}");
    assert!(err.contains("did you mean `row.status`?"), "{err}");
    assert!(!err.contains("row 1"), "{err}");
    assert!(
        err.contains("undefined template variable `row.idd`"),
        "{err}"
    );
    assert!(err.contains("did you mean `row.id`?"), "{err}");
}

#[tokio::test]
async fn a_dataset_that_keeps_no_row_is_a_warning_of_check() {
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.jsonl\" filter=\"{{{{ row.n > 5 }}}}\"\n\
         scenario \"s\" for-each=\"d\" {{\n    user \"hi\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[("data/d.jsonl", b"{\"n\": 1}\n{\"n\": 2}\n")]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    // A warning (exit 0): the suite is valid, it just runs nothing here.
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("scenario `s` has no instance to run: dataset `d` keeps no row (its filter is false for every row)"),
        "{err}"
    );
    // `run` has nothing to run, and says why rather than blame a selection nobody made.
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("scenario `s` has no instance: dataset `d` keeps no row"),
        "{err}"
    );
}

#[tokio::test]
async fn user_context_values_of_an_instance_render_its_row_typed() {
    let server = support::MisbehavingServer::respond(200, support::OK_BODY).await;
    let suite = format!(
        "agent \"a\" protocol=\"connexity\" url=\"{url}\"\n\
         dataset \"orders\" path=\"orders.csv\"\n\
         scenario \"refund\" for-each=\"orders\" {{\n    row-id \"{{{{ row.order_id }}}}\"\n    \
         user-context {{\n        order \"{{{{ row.order_id }}}}\"\n        amount \"{{{{ row.amount }}}}\"\n        \
         note \"order {{{{ row.order_id }}}} of {{{{ row.amount }}}}\"\n    }}\n    \
         user \"{{{{ user_context.order }}}}: {{{{ user_context.amount + 1 }}}} / {{{{ user_context.note }}}}\"\n    \
         expect no-error\n}}\n",
        url = server.url()
    );
    let dir = project(
        &suite,
        &[("orders.csv", b"order_id,amount\nA17,12\nB02,5\n")],
    );
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .args(["--jobs", "1", "--out"])
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let mut sent: Vec<String> = received(&server)
        .into_iter()
        .map(|m| m.last().unwrap().1.clone())
        .collect();
    sent.sort();
    // `amount` is the number 12 (12 + 1 = 13), not the text "12".
    assert_eq!(
        sent,
        ["A17: 13 / order A17 of 12", "B02: 6 / order B02 of 5"]
    );

    // A field the dataset does not have stops everything, naming the row and the value.
    std::fs::write(
        dir.path().join("suite.kdl"),
        suite.replace(
            "row.amount }}\"\n        note",
            "row.amount_eur }}\"\n        note",
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("row 1 of dataset `orders` (and 1 more instance)"),
        "{err}"
    );
    assert!(err.contains("`{{ row.amount_eur }}` is undefined"), "{err}");
}

#[tokio::test]
async fn judge_statements_and_outcomes_of_an_instance_read_its_row() {
    let suite = format!(
        "{AGENT}dataset \"orders\" path=\"orders.csv\"\n\
         scenario \"refund\" for-each=\"orders\" {{\n    row-id \"{{{{ row.order_id }}}}\"\n    \
         outcome \"order {{{{ row.order_id }}}} is refunded\"\n    \
         user \"Hi, I'd like to book a duct cleaning.\"\n    \
         expect judge \"the agent asks about order {{{{ row.order_id }}}}\"\n}}\n"
    );
    let dir = project(&suite, &[("orders.csv", b"order_id\nA17\nB02\n")]);
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    // No judge is configured: the checks are skipped, and recorded with the row's values.
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    let journal = journal_text(&out);
    for id in ["A17", "B02"] {
        assert!(
            journal.contains(&format!("the agent asks about order {id}")),
            "{journal}"
        );
        assert!(
            journal.contains(&format!("order {id} is refunded")),
            "{journal}"
        );
    }
    assert!(!journal.contains("row.order_id"), "{journal}");
}

/// Writes a Parquet file with pyarrow, the writer most Parquet files in the wild come from
/// (`.ci/run` installs it; without it this test fails rather than passing unseen).
fn pyarrow_parquet(dir: &Path, name: &str, script: &str) {
    let program = format!(
        "import datetime, decimal, sys\nimport pyarrow as pa, pyarrow.parquet as pq\n{script}\npq.write_table(t, sys.argv[1])\n"
    );
    let o = std::process::Command::new("python3")
        .args(["-c", &program])
        .arg(dir.join(name))
        .output()
        .expect("python3 runs (with pyarrow: `pip install pyarrow`)");
    assert!(
        o.status.success(),
        "pyarrow could not write {name} (`pip install pyarrow`): {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[tokio::test]
async fn parquet_structs_lists_of_structs_and_maps_come_through_nested_and_typed() {
    let dir = project("", &[]);
    pyarrow_parquet(
        dir.path(),
        "orders.parquet",
        r#"t = pa.table({
    "id": pa.array([1, 2, 3], pa.int64()),
    "customer": pa.array([{"name": "Zoë", "tier": 2, "vip": True}, None, {"name": "李", "tier": None, "vip": False}]),
    "items": pa.array([[{"sku": "A", "qty": 1}, {"sku": "B", "qty": 2}], [], None]),
    "attrs": pa.array([[("color", "red"), ("size", "L")], [], None], pa.map_(pa.string(), pa.string())),
    "when": pa.array([datetime.date(2024, 1, 2), None, datetime.date(2025, 12, 31)]),
    "score": pa.array([0.5, float("nan"), None]),
})"#,
    );
    let suite = format!(
        "{AGENT}dataset \"orders\" path=\"orders.parquet\"\n\
         scenario \"s\" for-each=\"orders\" {{\n\
             row-id \"o{{{{ row.id }}}}\"\n\
             user \"{{{{ row.customer.name if row.customer else 'nobody' }}}} \
                   tier={{{{ row.customer.tier if row.customer else '-' }}}} \
                   vip={{{{ row.customer.vip if row.customer else '-' }}}} \
                   qty={{{{ row['items'] | map(attribute='qty') | sum if row['items'] is not none else 'none' }}}} \
                   color={{{{ row.attrs.color if row.attrs else '-' }}}} \
                   keys={{{{ row.attrs | length if row.attrs is not none else 'none' }}}} \
                   when={{{{ row.when }}}} score={{{{ row.score }}}}\"\n\
             expect no-error\n\
         }}\n"
    );
    std::fs::write(dir.path().join("suite.kdl"), suite).unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let turns = read_parquet(&out.join("turns.parquet"));
    let mut sent: Vec<String> = strings(&turns, "user_message")
        .into_iter()
        .flatten()
        .map(|s| flat(&s))
        .collect();
    sent.sort();
    assert_eq!(
        sent,
        [
            "Zoë tier=2 vip=true qty=3 color=red keys=2 when=2024-01-02 score=0.5",
            "nobody tier=- vip=- qty=0 color=- keys=0 when=null score=null",
            "李 tier=null vip=false qty=none color=- keys=none when=2025-12-31 score=null",
        ]
    );
    // The results keep the row as nested JSON, so it joins back typed.
    let t = read_parquet(&out.join("trajectories.parquet"));
    let first = strings(&t, "row")
        .into_iter()
        .flatten()
        .map(|r| serde_json::from_str::<serde_json::Value>(&r).unwrap())
        .find(|r| r["id"] == 1)
        .unwrap();
    assert_eq!(
        first["customer"],
        serde_json::json!({"name": "Zoë", "tier": 2, "vip": true})
    );
    assert_eq!(
        first["items"],
        serde_json::json!([{"sku": "A", "qty": 1}, {"sku": "B", "qty": 2}])
    );
    assert_eq!(
        first["attrs"],
        serde_json::json!({"color": "red", "size": "L"})
    );
}

#[tokio::test]
async fn a_parquet_read_in_slices_keeps_row_numbers_and_stops_at_the_limit() {
    let dir = project("", &[]);
    // 5,000 rows in row groups of 700: the reader's slices cross row groups.
    pyarrow_parquet(
        dir.path(),
        "big.parquet",
        "t = pa.table({'id': list(range(1, 5001)), 'kind': ['odd' if i % 2 else 'even' for i in range(1, 5001)]})\n\
         pq.write_table(t, sys.argv[1], row_group_size=700)\nsys.exit(0)",
    );
    for (dataset, expected) in [
        (
            "filter=\"{{ row.id in [3, 1500, 4999] }}\"",
            &["suite/s[3]", "suite/s[1500]", "suite/s[4999]"][..],
        ),
        ("limit=2", &["suite/s[1]", "suite/s[2]"][..]),
        (
            "filter=\"{{ row.kind == 'even' and row.id > 4995 }}\"",
            &["suite/s[4996]", "suite/s[4998]", "suite/s[5000]"][..],
        ),
    ] {
        let suite = format!(
            "{AGENT}dataset \"big\" path=\"big.parquet\" {dataset}\n\
             scenario \"s\" for-each=\"big\" {{\n    row-id \"{{{{ row.id }}}}\"\n    user \"hi\"\n    expect no-error\n}}\n"
        );
        std::fs::write(dir.path().join("suite.kdl"), suite).unwrap();
        assert_eq!(listed(dir.path(), &[]).await, expected, "{dataset}");
    }
    // A row a filter fails on is named by its number in the file, past the first slices.
    std::fs::write(
        dir.path().join("suite.kdl"),
        format!(
            "{AGENT}dataset \"big\" path=\"big.parquet\" filter=\"{{{{ row.id < 4321 or row.kind + 1 }}}}\"\n\
             scenario \"s\" for-each=\"big\" {{\n    user \"hi\"\n    expect no-error\n}}\n"
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(flat(&stderr(&o)).contains("row 4321"), "{}", stderr(&o));
}

#[tokio::test]
async fn a_parquet_column_of_a_type_not_read_is_a_diagnostic_not_a_crash() {
    let dir = project("", &[]);
    pyarrow_parquet(
        dir.path(),
        "money.parquet",
        "t = pa.table({'id': [1], 'price': pa.array([decimal.Decimal('9.99')], pa.decimal256(40, 2))})",
    );
    std::fs::write(
        dir.path().join("suite.kdl"),
        format!(
            "{AGENT}dataset \"m\" path=\"money.parquet\"\n\
             scenario \"s\" for-each=\"m\" {{\n    user \"hi\"\n    expect no-error\n}}\n"
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("money.parquet") && err.contains("column `price` is a 256-bit decimal column"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test]
async fn parquet_decimals_and_small_integers_read_as_numbers() {
    let dir = project("", &[]);
    pyarrow_parquet(
        dir.path(),
        "orders.parquet",
        "t = pa.table({'id': pa.array([1, 2], pa.int8()), 'qty': pa.array([300, None], pa.uint16()), \
         'price': pa.array([decimal.Decimal('9.50'), None], pa.decimal128(7, 2))})",
    );
    std::fs::write(
        dir.path().join("suite.kdl"),
        format!(
            "{AGENT}dataset \"o\" path=\"orders.parquet\" filter=\"{{{{ row.id + 1 > 2 }}}}\"\n\
             scenario \"s\" for-each=\"o\" {{\n    \
             row-id \"{{{{ row.id * 10 }}}}-{{{{ row.qty }}}}-{{{{ row.price }}}}\"\n    \
             user \"hi\"\n    expect no-error\n}}\n"
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("list")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    // Arithmetic works on them (numbers, not text), and the filter kept only id 2, whose
    // quantity and price are null.
    assert!(out.contains("s[20-null-null]"), "{out}");
    assert!(!out.contains("s[10-"), "{out}");
    let dir2 = project("", &[]);
    pyarrow_parquet(
        dir2.path(),
        "orders.parquet",
        "t = pa.table({'id': pa.array([1], pa.int8()), 'qty': pa.array([300], pa.uint16()), \
         'price': pa.array([decimal.Decimal('9.50')], pa.decimal128(7, 2))})",
    );
    std::fs::write(
        dir2.path().join("suite.kdl"),
        format!(
            "{AGENT}dataset \"o\" path=\"orders.parquet\"\n\
             scenario \"s\" for-each=\"o\" {{\n    \
             row-id \"{{{{ row.id * 10 }}}}-{{{{ row.qty + 1 }}}}-{{{{ row.price * 2 }}}}\"\n    \
             user \"hi\"\n    expect no-error\n}}\n"
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("list")
        .arg(dir2.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("s[10-301-19.0]"), "{}", stdout(&o));
}

#[tokio::test]
async fn parquet_times_durations_zoned_timestamps_and_bytes_read_as_text() {
    let dir = project("", &[]);
    pyarrow_parquet(
        dir.path(),
        "times.parquet",
        "t = pa.table({'id': [1, 2], \
         'at': pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 500000), None], pa.timestamp('ms')), \
         'zoned': pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)] * 2, pa.timestamp('s', tz='Europe/Paris')), \
         'opens': pa.array([datetime.time(9, 30), datetime.time(12, 0, 0, 500000)], pa.time64('us')), \
         'took': pa.array([datetime.timedelta(days=1, seconds=3723, milliseconds=500), datetime.timedelta(0)], pa.duration('ms')), \
         'tag': pa.array([b'gold', None], pa.binary())})",
    );
    std::fs::write(
        dir.path().join("suite.kdl"),
        format!(
            "{AGENT}dataset \"t\" path=\"times.parquet\"\n\
             scenario \"s\" for-each=\"t\" {{\n    \
             row-id \"{{{{ row.id }}}}|{{{{ row.at }}}}|{{{{ row.zoned }}}}|{{{{ row.opens }}}}|{{{{ row.took }}}}|{{{{ row.tag }}}}\"\n    \
             user \"hi\"\n    expect no-error\n}}\n"
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("list")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for id in [
        "s[1|2024-01-02 03:04:05.500|2024-01-02 03:04:05+00:00|09:30:00|P1DT1H2M3.5S|gold]",
        "s[2|null|2024-01-02 03:04:05+00:00|12:00:00.5|PT0S|null]",
    ] {
        assert!(out.contains(id), "{id} in:\n{out}");
    }
}

#[tokio::test]
async fn a_parquet_category_column_reads_as_its_values() {
    // pandas writes its `category` columns as Arrow dictionaries (here inside a struct too).
    let dir = project("", &[]);
    pyarrow_parquet(
        dir.path(),
        "cases.parquet",
        "intent = pa.array(['refund', 'status', 'refund']).dictionary_encode()\n\
         t = pa.table({'id': [1, 2, 3], 'intent': intent, \
         'meta': pa.StructArray.from_arrays([intent], names=['kind'])})",
    );
    std::fs::write(
        dir.path().join("suite.kdl"),
        format!(
            "{AGENT}dataset \"c\" path=\"cases.parquet\"\n\
             scenario \"s\" for-each=\"c\" {{\n    \
             row-id \"{{{{ row.intent }}}}-{{{{ row.meta.kind }}}}-{{{{ row.id }}}}\"\n    \
             user \"hi\"\n    expect no-error\n}}\n"
        ),
    )
    .unwrap();
    let o = trellis()
        .arg("list")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for id in [
        "s[refund-refund-1]",
        "s[status-status-2]",
        "s[refund-refund-3]",
    ] {
        assert!(out.contains(id), "{id} in:\n{out}");
    }
}

#[tokio::test]
async fn check_says_a_warning_shared_by_every_instance_once() {
    let mut csv = String::from("id,q\n");
    for i in 0..50 {
        csv.push_str(&format!("r{i},question {i}\n"));
    }
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"d.csv\"\n\
         scenario \"ask\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    user \"{{{{ row.q }}}}\"\n    expect judge \"answers {{{{ row.q }}}}\"\n}}\n\
         scenario \"tones\" {{\n    matrix {{\n        tone \"a\" \"b\"\n    }}\n    user \"hi\"\n    outcome \"fine\"\n}}\n"
    );
    let dir = project(&suite, &[("d.csv", csv.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert_eq!(err.matches("will be skipped").count(), 4, "{err}");
    assert!(
        err.contains(
            "scenario `ask` (all 50 instances: ask[r0], ask[r1], ask[r2], …): this `judge` check will be skipped"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "scenario `tones` (all 2 instances: tones[tone=a], tones[tone=b]): this `outcome` check"
        ),
        "{err}"
    );
    assert!(
        stdout(&o).contains("52 checks will be skipped; see the 2 warnings above"),
        "{}",
        stdout(&o)
    );
}

#[tokio::test]
async fn case_files_other_tools_export_load_as_datasets() {
    let server = support::MisbehavingServer::respond(200, support::OK_BODY).await;
    // promptfoo's tests CSV, as a spreadsheet saves it: a byte-order mark, CRLF, `vars`
    // columns and promptfoo's `__expected` / `__description`.
    let promptfoo = "\u{feff}question,topic,__expected,__description\r\n\
                     \"What is 2+2?\",math,contains:4,simple-sum\r\n\
                     \"Capital of France?\",geo,\"icontains:paris\",capital\r\n";
    // Inspect AI samples (`json_dataset`): `input` a string or a message list.
    let inspect = "{\"id\": \"q1\", \"input\": \"What is 2+2?\", \"target\": \"4\", \"metadata\": {\"level\": 1}}\n\
                   {\"id\": \"q2\", \"input\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Capital of France?\"}], \"target\": [\"Paris\"], \"metadata\": {\"level\": 2}}\n";
    // DeepEval goldens, and the same wrapped in an object as some exports write them.
    let goldens = r#"[{"input": "Refund order A17", "expected_output": "refunded", "context": ["orders"], "additional_metadata": {"source": "prod"}},
                      {"input": "Where is B2?", "expected_output": "shipped", "context": null, "additional_metadata": null}]"#;
    let wrapped = format!("{{\"version\": 1, \"goldens\": {goldens}}}");
    // A semicolon CSV (spreadsheets in many locales) and a TSV.
    let semicolon = "q;n\r\n\"a;b\";1\r\nc;2\r\n";
    let tsv = "q\tn\nhello\t1\nworld\t2\n";
    let suite = format!(
        "agent \"a\" protocol=\"connexity\" url=\"{url}\"\n\
         dataset \"pf\" path=\"promptfoo.csv\"\n\
         dataset \"inspect\" path=\"inspect.jsonl\"\n\
         dataset \"goldens\" path=\"goldens.json\"\n\
         dataset \"wrapped\" path=\"wrapped.json\" limit=1\n\
         dataset \"semi\" path=\"semi.csv\"\n\
         dataset \"tsv\" path=\"cases.tsv\"\n\
         scenario \"pf\" for-each=\"pf\" {{\n    row-id \"{{{{ row.__description }}}}\"\n    user \"{{{{ row.question }}}} [{{{{ row.topic }}}}] {{{{ row.__expected }}}}\"\n    expect no-error\n}}\n\
         scenario \"inspect\" for-each=\"inspect\" {{\n    row-id \"{{{{ row.id }}}}\"\n    history \"{{{{ row.input }}}}\"\n    expect no-error\n}}\n\
         scenario \"goldens\" for-each=\"goldens\" {{\n    user \"{{{{ row.input }}}} ({{{{ row.context | length if row.context else 0 }}}})\"\n    expect no-error\n}}\n\
         scenario \"wrapped\" for-each=\"wrapped\" {{\n    user \"{{{{ row.input }}}}\"\n    expect no-error\n}}\n\
         scenario \"semi\" for-each=\"semi\" {{\n    row-id \"{{{{ row.q }}}}\"\n    user \"{{{{ row.n + 1 }}}}\"\n    expect no-error\n}}\n\
         scenario \"tsv\" for-each=\"tsv\" {{\n    row-id \"{{{{ row.q }}}}\"\n    user \"{{{{ row.n * 10 }}}}\"\n    expect no-error\n}}\n",
        url = server.url()
    );
    let dir = project(
        &suite,
        &[
            ("promptfoo.csv", promptfoo.as_bytes()),
            ("inspect.jsonl", inspect.as_bytes()),
            ("goldens.json", goldens.as_bytes()),
            ("wrapped.json", wrapped.as_bytes()),
            ("semi.csv", semicolon.as_bytes()),
            ("cases.tsv", tsv.as_bytes()),
        ],
    );
    let mut ids = listed(dir.path(), &[]).await;
    ids.retain(|id| !id.starts_with("suite/goldens"));
    assert_eq!(
        ids,
        [
            "suite/pf[simple-sum]",
            "suite/pf[capital]",
            "suite/inspect[q1]",
            "suite/inspect[q2]",
            // The first row of the array under `goldens` (its content's hash).
            "suite/wrapped[ec0c89de19df]",
            "suite/semi[a;b]",
            "suite/semi[c]",
            "suite/tsv[hello]",
            "suite/tsv[world]",
        ]
    );
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .args(["--jobs", "1", "--out"])
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let mut first: Vec<Vec<(String, String)>> = received(&server);
    first.sort();
    let mut expected = vec![
        pairs(&[("user", "What is 2+2? [math] contains:4")]),
        pairs(&[("user", "Capital of France? [geo] icontains:paris")]),
        // Inspect's string input is one user message; its message list is the history
        // (the system message left out), its last user message the first turn.
        pairs(&[("user", "What is 2+2?")]),
        pairs(&[("user", "Capital of France?")]),
        pairs(&[("user", "Refund order A17 (1)")]),
        pairs(&[("user", "Where is B2? (0)")]),
        pairs(&[("user", "Refund order A17")]),
        pairs(&[("user", "2")]),
        pairs(&[("user", "3")]),
        pairs(&[("user", "10")]),
        pairs(&[("user", "20")]),
    ];
    expected.sort();
    assert_eq!(first, expected);
}

#[tokio::test]
async fn the_console_and_the_report_pivot_a_matrix_by_each_variable() {
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"d.jsonl\"\n\
         scenario \"ask\" for-each=\"d\" {{\n    matrix {{\n        want \"postal code\" \"zebra\"\n        n 1 2\n    }}\n    user \"I want a duct cleaning\"\n    expect reply contains=\"{{{{ vars.want }}}}\"\n}}\n"
    );
    let dir = project(
        &suite,
        &[("d.jsonl", b"{\"id\": 1}\n{\"id\": 2}\n".as_slice())],
    );
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let console = stdout(&o);
    // One grid per variable, variables and values in the order written; each cell every
    // instance with the value (2 rows × 2 values of the other variable).
    let at = console
        .find("suite: by matrix value `want` (pass rate, 95% CI)")
        .unwrap_or_else(|| panic!("no grid in {console}"));
    let grid = &console[at..];
    let header = grid.lines().nth(2).unwrap();
    assert!(
        header.find("want=postal code").unwrap() < header.find("want=zebra").unwrap(),
        "{grid}"
    );
    let row = grid.lines().find(|l| l.contains(" ask ")).unwrap();
    assert!(
        row.contains("100% (51–100%)") && row.contains("0% (0–49%)"),
        "{grid}"
    );
    let n = &console[console
        .find("suite: by matrix value `n`")
        .unwrap_or_else(|| panic!("no grid of n in {console}"))..];
    assert!(n.find("n=1").unwrap() < n.find("n=2").unwrap(), "{n}");
    assert!(at < console.find("suite: by matrix value `n`").unwrap());
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let grid = &html[html
        .find("<h2>By matrix value: suite · want</h2>")
        .unwrap_or_else(|| panic!("no grid in the report"))..];
    let row = &grid[grid.find("title=\"ask\"").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains("title=\"95% CI 51–100%\">100.0%")
            && row.contains("title=\"95% CI 0–49%\">0.0%"),
        "{row}"
    );
}

/// Its counts are every instance's, failures included.
#[tokio::test]
async fn the_summary_is_one_row_for_a_scenario_of_many_instances() {
    let mut csv = String::from("id,want\n");
    for i in 0..25 {
        // Two fail: the reply lacks the text they want.
        let want = if i == 3 || i == 17 {
            "no such text"
        } else {
            "book"
        };
        csv.push_str(&format!("r{i},{want}\n"));
    }
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"d.csv\"\n\
         scenario \"ask\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    user \"hi {{{{ row.id }}}}\"\n    expect reply contains=\"{{{{ row.want }}}}\"\n}}\n\
         scenario \"few\" {{\n    matrix {{\n        n 1 2\n    }}\n    user \"hi\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[("d.csv", csv.as_bytes())]);
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let console = stdout(&o);
    let row = console
        .lines()
        .find(|l| l.contains("ask (25 instances)"))
        .unwrap_or_else(|| panic!("no row of all instances in {console}"));
    let cells: Vec<&str> = row.split(['│', '┆']).map(str::trim).collect();
    assert_eq!(
        cells[1..cells.len() - 1],
        [
            "suite",
            "ask (25 instances)",
            "demo",
            "23",
            "2",
            "0",
            "0",
            "0",
            "92%",
            "75–98%"
        ],
        "{row}"
    );
    assert_eq!(
        console.matches("ask (25 instances)").count(),
        1,
        "{console}"
    );
    assert!(!console.contains("ask[r0]"), "{console}");
    // A scenario of a few instances keeps a row each.
    assert!(
        console.contains("few[n=1]") && console.contains("few[n=2]"),
        "{console}"
    );
}

/// A suite of more scenarios than the console lists: the summary keeps the rows that did
/// not all pass and counts the rest, the agents' grid its first rows; the results files
/// keep every one.
#[tokio::test]
async fn a_summary_of_very_many_scenarios_lists_what_did_not_pass_and_counts_the_rest() {
    let mut suite = String::from(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         agent \"b\" protocol=\"connexity\" builtin=\"booking\"\n",
    );
    for i in 0..130 {
        // Two fail: their reply lacks the text they ask for.
        let check = if i == 17 || i == 101 {
            "expect reply contains=\"no such text\""
        } else {
            "expect no-error"
        };
        suite.push_str(&format!(
            "scenario \"s{i:03}\" {{\n    agents \"a\" \"b\"\n    user \"Hi\"\n    {check}\n}}\n"
        ));
    }
    let dir = project(&suite, &[]);
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let console = stdout(&o);
    let summary = &console[..console
        .find("suite: agents side by side")
        .unwrap_or_else(|| panic!("no grid in {console}"))];
    let rows: Vec<&str> = summary
        .lines()
        .filter(|l| l.contains("┆ s0") || l.contains("┆ s1"))
        .collect();
    assert_eq!(rows.len(), 4, "{summary}");
    for (row, (scenario, agent)) in
        rows.iter()
            .zip([("s017", "a"), ("s017", "b"), ("s101", "a"), ("s101", "b")])
    {
        assert!(
            row.contains(&format!(" {scenario} ")) && row.contains(&format!(" {agent} ")),
            "{summary}"
        );
    }
    assert!(
        summary.contains("… and 256 more rows (all passed); trajectories.parquet has every one"),
        "{summary}"
    );
    let grid = &console[console.find("suite: agents side by side").unwrap()..];
    let grid = &grid[..grid.find("FAIL ").unwrap_or(grid.len())];
    let grid_rows: Vec<&str> = grid
        .lines()
        .filter(|l| l.contains(" s0") || l.contains(" s1"))
        .collect();
    assert_eq!(grid_rows.len(), 2, "{grid}");
    assert!(
        grid_rows[0].contains(" s017 ") && grid_rows[1].contains(" s101 "),
        "{grid}"
    );
    assert!(
        grid.contains(
            "… and 128 more scenarios (all passed on every agent); trajectories.parquet has \
             every one"
        ),
        "{grid}"
    );
    let summary_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary_json["stats"]["scenarios"].as_array().unwrap().len(),
        260
    );

    // All passed: no table of rows, only how many there were.
    let passing = suite.replace("expect reply contains=\"no such text\"", "expect no-error");
    std::fs::write(dir.path().join("suite.kdl"), passing).unwrap();
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .arg("--replace")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let console = stdout(&o);
    assert!(
        console.starts_with(
            "260 scenario rows, all passed: too many to list here (trajectories.parquet has \
             every one)\nsuite: agents side by side: 130 scenarios, all passed on every agent: \
             too many to list here (trajectories.parquet has every one)\n"
        ),
        "{console}"
    );
}

/// A variable of many values: its grid has a row per value (the scenarios as columns)
/// instead of a column each, at most 100 of them, the rest counted.
#[tokio::test]
async fn a_matrix_of_many_values_is_a_grid_of_a_row_per_value() {
    let values: Vec<String> = (0..105).map(|i| i.to_string()).collect();
    let suite = format!(
        "{AGENT}scenario \"ask\" {{\n    matrix {{\n        n {}\n    }}\n    user \"Hi {{{{ vars.n }}}}\"\n    \
         expect no-error\n}}\n\
         scenario \"few\" {{\n    matrix {{\n        m 1 2\n    }}\n    user \"Hi\"\n    expect no-error\n}}\n",
        values.join(" ")
    );
    let dir = project(&suite, &[]);
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let console = stdout(&o);
    let grid = &console[console
        .find("suite: by matrix value `n`")
        .unwrap_or_else(|| panic!("no grid of n in {console}"))..];
    let lines: Vec<&str> = grid.lines().collect();
    assert!(
        lines[2].contains(" n ") && lines[2].contains(" ask ") && !lines[2].contains("n=0"),
        "{grid}"
    );
    let rows: Vec<&str> = lines
        .iter()
        .copied()
        .take_while(|l| !l.contains("m="))
        .filter(|l| l.contains("100%"))
        .collect();
    assert_eq!(rows.len(), 100, "{grid}");
    assert!(
        rows[0].starts_with("│ 0 ") && rows[99].starts_with("│ 99 "),
        "{grid}"
    );
    assert!(
        grid.contains("… and 5 more values (report.html has every one)"),
        "{grid}"
    );
    // A variable of few values keeps a column each.
    assert!(
        console.contains("m=1") && console.contains("m=2"),
        "{console}"
    );
    assert!(lines.iter().all(|l| l.chars().count() < 200), "{grid}");
}

#[tokio::test]
async fn a_dataset_with_a_header_and_no_rows_checks_row_against_its_header() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("empty.csv"), "order_id,name\n").unwrap();
    let suite = dir.path().join("s.kdl");
    let text = |column: &str| {
        format!(
            "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
             dataset \"d\" path=\"empty.csv\"\n\
             scenario \"s\" for-each=\"d\" {{\n    user \"Hi {{{{ row.{column} }}}}\"\n    \
             expect no-error\n}}\n"
        )
    };
    // The header names `name`: nothing to run, a warning, not an error.
    std::fs::write(&suite, text("name")).unwrap();
    let o = trellis().arg("check").arg(&suite).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("keeps no row"), "{}", stderr(&o));
    // A column it does not name is still caught.
    std::fs::write(&suite, text("nmae")).unwrap();
    let o = trellis().arg("check").arg(&suite).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("row.name"), "{}", stderr(&o));
}

#[tokio::test]
async fn a_report_of_thousands_of_instances_draws_the_failures_and_counts_the_rest() {
    // 260 rows, two of which expect what the agent never says: one early, one past the
    // scenarios the page would draw in plan order.
    let mut csv = String::from("id,word\n");
    for i in 0..260 {
        let word = if i == 100 || i == 250 {
            "zebra"
        } else {
            "postal code"
        };
        csv.push_str(&format!("r{i:03},{word}\n"));
    }
    let suite = format!(
        "{AGENT}dataset \"rows\" path=\"rows.csv\"\n\
         scenario \"many\" for-each=\"rows\" {{\n\
             row-id \"{{{{ row.id }}}}\"\n\
             user \"Hi, I would like to book a duct cleaning.\"\n\
             expect reply contains=\"{{{{ row.word }}}}\"\n\
         }}\n\
         scenario \"big\" {{\n\
             user \"Hi, I would like to book a duct cleaning.\"\n\
             branch \"a\" {{ user \"A\"; }}\n\
             branch \"b\" {{ user \"B\"; }}\n\
             branch \"c\" {{ user \"C\"; }}\n\
             expect no-error\n\
         }}\n"
    );
    let dir = project(&suite, &[("rows.csv", csv.as_bytes())]);
    let out = dir.path().join("out");
    let o = trellis()
        .args(["run", "-q"])
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert_eq!(html.matches("<section class=\"scenario\"").count(), 200);
    for failing in ["many[r100]", "many[r250]"] {
        assert!(html.contains(&format!("<h3>{failing}</h3>")), "{failing}");
    }
    // Then the larger: the branching scenario planned last is drawn before the one-turn
    // instances; then plan order: the first rows are drawn, the last passing ones are not.
    assert!(html.contains("<h3>big</h3>"));
    assert!(html.contains("<h3>many[r000]</h3>"));
    assert!(!html.contains("<h3>many[r259]</h3>"));
    assert!(
        html.contains(
            "Not drawn here: 61 of 261 scenarios (every one of their 61 trajectories passed)"
        ),
        "{}",
        &html[html.find("Not drawn").unwrap_or(0)..][..300.min(html.len())]
    );
    assert!(html.contains("… 61 more scenarios not drawn on this page"));
    // The totals count every one.
    assert!(html.contains("<b>263</b><span>trajectories</span>"));
    assert_eq!(
        read_parquet(&out.join("trajectories.parquet")).height(),
        263
    );

    // More failures than the page draws: those it has no room for are named in its note.
    let mut csv = String::from("id,word\n");
    for i in 0..203 {
        csv.push_str(&format!("r{i:03},zebra\n"));
    }
    std::fs::write(dir.path().join("rows.csv"), csv).unwrap();
    let o = trellis()
        .args(["run", "-q", "--replace"])
        .arg(dir.path().join("suite.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let note = &html[html.find("Not drawn here").unwrap()..];
    let note = &note[..note.find("trajectories.parquet").unwrap()];
    assert!(
        note.contains("Not drawn and not all passed: ")
            && ["many[r200]", "many[r201]", "many[r202]"]
                .iter()
                .all(|name| note.contains(name)),
        "{note}"
    );
}

#[tokio::test]
async fn a_null_column_in_user_context_is_null_not_an_error() {
    let server = support::MisbehavingServer::respond(200, support::OK_BODY).await;
    let suite = format!(
        "agent \"a\" protocol=\"connexity\" url=\"{url}\"\n\
         dataset \"orders\" path=\"orders.jsonl\"\n\
         scenario \"s\" for-each=\"orders\" {{\n    row-id \"{{{{ row.id }}}}\"\n    \
         user-context {{\n        coupon \"{{{{ row.coupon }}}}\"\n    }}\n    \
         user \"coupon: {{{{ user_context.coupon or 'none' }}}}\"\n    expect no-error\n}}\n",
        url = server.url()
    );
    // The second row's coupon is null, the third lacks it (null as well).
    let dir = project(
        &suite,
        &[(
            "orders.jsonl",
            b"{\"id\":\"a\",\"coupon\":\"SAVE10\"}\n{\"id\":\"b\",\"coupon\":null}\n{\"id\":\"c\"}\n",
        )],
    );
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("suite.kdl"))
        .args(["--jobs", "1", "--out"])
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let mut sent: Vec<String> = received(&server)
        .into_iter()
        .map(|m| m.last().unwrap().1.clone())
        .collect();
    sent.sort();
    assert_eq!(sent, ["coupon: SAVE10", "coupon: none", "coupon: none"]);

    // An attribute no row has, below a column: undefined, and named.
    std::fs::write(
        dir.path().join("suite.kdl"),
        suite.replace("{{ row.coupon }}", "{{ row.coupon.code }}"),
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("`{{ row.coupon.code }}` is undefined"),
        "{err}"
    );
}

#[tokio::test]
async fn a_dataset_path_that_is_a_directory_or_empty_says_so() {
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data\"\ndataset \"e\" path=\"\"\n\
         scenario \"s\" for-each=\"d\" {{ row-id \"{{{{ row.id }}}}\"; user \"hi\" }}\n\
         scenario \"t\" for-each=\"e\" {{ row-id \"{{{{ row.id }}}}\"; user \"hi\" }}\n"
    );
    let dir = project(&suite, &[("data/a.csv", b"id\n1\n")]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("data is a directory"), "{err}");
    assert!(err.contains("dataset `e`: the path is empty"), "{err}");
    assert!(!err.contains("unknown dataset format"), "{err}");
}

/// A row-id that clashes on nearly every row is shown for a few rows and counted for the
/// rest; and a scenario's runs are capped over all its instances, not per row.
#[tokio::test]
async fn clashing_row_ids_are_counted_and_runs_capped_over_every_instance() {
    let rows: String = std::iter::once("id,status\n".to_owned())
        .chain((0..500).map(|i| format!("{i},open\n")))
        .collect();
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"d.csv\"\n\
         scenario \"s\" for-each=\"d\" {{\n    row-id \"{{{{ row.status }}}}\"\n    user \"{{{{ row.id }}}}\"\n    expect no-error\n}}\n\
         scenario \"r\" for-each=\"d\" {{\n    repeat 5000\n    user \"{{{{ row.id }}}}\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[("d.csv", rows.as_bytes())]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    let err = flat(&stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("5 errors in suite files"), "{err}");
    assert!(
        err.contains("496 more rows of dataset `d` have an id an earlier row has (499 in all)"),
        "{err}"
    );
    assert!(
        err.contains("scenario `r` runs 2500000 times: 500 instances"),
        "{err}"
    );
}

/// A null inside a judge statement's text (`the agent answered {{ row.msg }}`) is an error
/// naming the row, as one that is the whole statement is (docs/language.md): it rendered
/// `none`, and the judge was asked about it. A guarded read is not.
#[tokio::test]
async fn a_null_inside_a_judge_statement_is_an_error_naming_the_row() {
    let suite = "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         dataset \"rows\" path=\"rows.jsonl\"\n\
         scenario \"s\" for-each=\"rows\" {\n    row-id \"{{ row.id }}\"\n    \
         user \"hi\"\n    expect judge \"the agent answered {{ row.msg }}\"\n}\n";
    let dir = project(
        suite,
        &[(
            "rows.jsonl",
            b"{\"id\":\"a\",\"msg\":\"hello\"}\n{\"id\":\"nul\",\"msg\":null}\n",
        )],
    );
    let check = || async {
        trellis()
            .arg("check")
            .arg(dir.path().join("suite.kdl"))
            .output()
            .await
            .unwrap()
    };
    let o = check().await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(err.contains("`{{ row.msg }}` is null"), "{err}");
    assert!(err.contains("nul"), "{err}");

    std::fs::write(
        dir.path().join("suite.kdl"),
        suite.replace("{{ row.msg }}", "{{ row.msg or 'nothing' }}"),
    )
    .unwrap();
    let o = check().await;
    assert!(!flat(&stderr(&o)).contains("is null"), "{}", stderr(&o));
}

/// An agent's header shared by a `for-each` scenario and a plain one may read `row` behind
/// `row is defined` (inline or as a block): accepted, and both scenarios run. A read guarded
/// only by `| default(…)` is still refused at `check`: strict rendering refuses a field of an
/// undefined `row` at run time, and the help says how to guard it.
#[tokio::test]
async fn a_shared_header_reads_row_behind_is_defined() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("orders.csv"), "order_id\nA-1\n").unwrap();
    let suite = |header: &str| {
        format!(
            "agent \"s\" protocol=\"connexity\" builtin=\"booking\" {{\n    header \"X-Row\" \
             \"{header}\"\n}}\ndataset \"o\" path=\"orders.csv\"\n\
             scenario \"with-row\" for-each=\"o\" {{ user \"hi\"; expect no-error; }}\n\
             scenario \"no-row\" {{ user \"hi\"; expect no-error; }}\n"
        )
    };
    for (i, header) in [
        "{{ row.order_id if row is defined else 'none' }}",
        "{% if row is defined %}{{ row.order_id }}{% endif %}",
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.path().join(format!("ok{i}.kdl"));
        std::fs::write(&path, suite(header)).unwrap();
        let o = trellis()
            .arg("run")
            .arg(&path)
            .args(["-q", "--out"])
            .arg(dir.path().join(format!("out{i}")))
            .output()
            .await
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{header}: {}{}",
            stdout(&o),
            stderr(&o)
        );
    }
    let path = dir.path().join("default.kdl");
    std::fs::write(&path, suite("{{ row.order_id | default('none') }}")).unwrap();
    let o = crate::check(&path).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        crate::flat(&stderr(&o)).contains("read it only behind `{% if row is defined %}`"),
        "{}",
        stderr(&o)
    );
}

/// A filter whose expression gives text (`{{ row.status }}`) kept every row with a status,
/// its truth being only whether it is empty: an error naming the row, with the fix.
#[tokio::test]
async fn a_filter_that_gives_text_is_an_error_not_a_truth() {
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.csv\" filter=\"{{{{ row.status }}}}\"\n\
         scenario \"s\" for-each=\"d\" {{\n    user \"hi\"\n    expect no-error\n}}\n"
    );
    let dir = project(&suite, &[("data/d.csv", b"id,status\n1,closed\n2,open\n")]);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("the filter gave the text `closed`, not true or false"),
        "{err}"
    );
    assert!(err.contains("row 1"), "{err}");

    // Text that says true or false (pandas writes `True`) is read as the text form's is.
    let suite = format!(
        "{AGENT}dataset \"d\" path=\"data/d.csv\" filter=\"{{{{ row.open }}}}\"\n\
         scenario \"s\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    user \"hi\"\n    \
         expect no-error\n}}\n"
    );
    let dir = project(
        &suite,
        &[("data/d.csv", b"id,open\na,True\nb,False\nc,TRUE\n")],
    );
    let o = trellis()
        .arg("list")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let listed = stdout(&o);
    assert!(
        listed.contains("s[a]") && listed.contains("s[c]"),
        "{listed}"
    );
    assert!(!listed.contains("s[b]"), "{listed}");
}

/// A CSV field that would not read back the same as a number stays text (`1.50`), and a
/// text compared with a number orders after every one: `row.price > 10` kept it silently.
/// A verdict that turns on the field's type, not its value, is an error naming the row
/// and the column; comparing the text itself (`row.zip == '02134'`) stands, and so does
/// the comparison made as numbers.
#[tokio::test]
async fn a_filter_comparing_a_number_kept_as_text_with_a_number_is_an_error() {
    let data: &[(&str, &[u8])] = &[(
        "data/d.csv",
        b"id,price,zip,code\na,1.50,02134,007\nb,12.5,10001,0123\nc,30.00,02139,012\n",
    )];
    let suite = |filter: &str| {
        format!(
            "{AGENT}dataset \"d\" path=\"data/d.csv\" filter=\"{filter}\"\n\
             scenario \"s\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    user \"hi\"\n    \
             expect no-error\n}}\n"
        )
    };
    let dir = project(&suite("{{ row.price > 10 }}"), data);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("the filter compares `price`, the text `1.50`, with a number"),
        "{err}"
    );
    assert!(err.contains("row 1"), "{err}");
    assert!(err.contains("compare it as a number (`row.price"), "{err}");
    // An integer's text (`007`) is read with `int`, not `float`.
    let dir = project(&suite("{{ row.code < 100 }}"), data);
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("suite.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(err.contains("the text `007`"), "{err}");
    assert!(err.contains("int`) or as text (`'007'`)"), "{err}");

    // Text work on a field a number would fail (`| length`, `in`, slices) and type tests
    // are no comparison with a number.
    for (filter, kept) in [
        ("{{ row.price | float > 10 }}", &["s[b]", "s[c]"][..]),
        ("{{ row.zip == '02134' }}", &["s[a]"][..]),
        ("{{ row.id != 'b' }}", &["s[a]", "s[c]"][..]),
        (
            "{{ row.code | length == 3 and row.code[:2] == '00' }}",
            &["s[a]"][..],
        ),
        ("{{ '12' in row.code }}", &["s[b]", "s[c]"][..]),
        ("{{ row.code is string }}", &["s[a]", "s[b]", "s[c]"][..]),
        ("{{ row.price is not number }}", &["s[a]", "s[c]"][..]),
    ] {
        let dir = project(&suite(filter), data);
        let o = trellis()
            .arg("list")
            .arg(dir.path().join("suite.kdl"))
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{filter}: {}", stderr(&o));
        let listed = stdout(&o);
        for id in ["s[a]", "s[b]", "s[c]"] {
            assert_eq!(
                listed.contains(id),
                kept.contains(&id),
                "{filter}: {listed}"
            );
        }
    }
}
