"""The abstention-signals experiment's arithmetic: ceilings, rules, the pick (no encoder, no index)."""

from __future__ import annotations

import math

from lab.experiments.abstention_signals import (
    Rule, SignalRecord, ceiling, ceiling_either, ceilings, judge, markdown, pick,
)


def record(kb: str, covered: bool, relevance: float, dense: float, automatic: bool = False) -> SignalRecord:
    return SignalRecord(kb, f"{kb}-{relevance}-{dense}-{covered}", "q" if covered else "uncovered", covered,
                        "train", relevance, dense, automatic)


def test_the_ceiling_allows_five_percent_of_covered_questions_below_the_threshold():
    covered = [float(v) for v in range(1, 21)]  # 20: one may be refused (5 %)
    uncovered = [0.5, 1.5, 2.5, 30.0]
    # threshold just above the lowest covered score: 0.5 and 1.5 are caught, 2.5 is not
    assert ceiling(covered, uncovered) == 0.5
    assert ceiling(covered, uncovered, max_false=0.0) == 0.25  # nothing covered may fall below: only 0.5
    assert math.isnan(ceiling([], uncovered))


def test_either_finds_a_pair_no_single_signal_does():
    covered = [(1.0, 0.9), (1.1, 0.8), (0.2, 0.95), (0.9, 0.3)] * 5  # each signal alone has a low covered one
    uncovered = [(0.3, 0.9), (1.2, 0.35)]
    assert ceiling_either(covered, uncovered, max_false=0.0) == 0.0
    # 5 of 20 covered (25 %) may be refused: either the relevance cut or the dense cut catches one
    assert ceiling_either(covered, uncovered, max_false=0.25) == 0.5
    assert ceiling_either(covered, uncovered, max_false=0.5) == 1.0


def test_ceilings_report_counts_and_auc():
    records = [record("k", True, 1.0 + i / 10, 0.7) for i in range(10)] + [record("k", False, 0.1, 0.2)]
    found = ceilings(records)
    assert found["covered"] == 10 and found["uncovered"] == 1
    assert found["relevance"] == 1.0 and found["auc_relevance"] == 1.0


def test_the_pick_keeps_the_false_budget_on_every_knowledge_base_then_maximises_catch():
    records = ([record("a", True, 1.0, 0.5 + i / 100) for i in range(40)] + [record("a", False, 1.0, 0.3)]
               + [record("b", True, 1.0, 0.6) for _ in range(40)] + [record("b", False, 0.1, 0.55, automatic=True)])
    probes = {"a": {}, "b": {}}
    rules = [Rule("automatic alone", lambda p: -math.inf, True),
             Rule("dense below 0.4", lambda p: 0.4, True),
             Rule("dense below 0.7", lambda p: 0.7, True)]  # catches all, refuses every covered one
    table = [judge(rule, records, probes, ("a", "b")) for rule in rules]
    assert table[0]["cells"]["a"] == {"caught": 0.0, "false": 0.0, "threshold": None}
    assert table[1]["cells"]["a"]["caught"] == 1.0 and table[1]["cells"]["b"]["caught"] == 1.0
    best = pick(table)
    assert best is table[1] and best["picked"] and not table[2].get("picked")
    assert pick([table[2]]) is None


def test_the_readme_names_the_pick_and_every_knowledge_base():
    cell = {"estimate": 0.5, "low": 0.4, "high": 0.6}
    per_kb = {"covered": 10, "uncovered": 5, "automatic": {"caught": cell, "false": cell},
              "picked": {"caught": cell, "false": cell}, "picked - automatic, caught": cell,
              "picked - automatic, false": cell}
    c = {"relevance": 0.5, "dense": 0.6, "either": 0.7, "combined": 0.8, "auc_relevance": 0.9,
         "auc_dense": 0.9, "auc_combined": 0.95, "covered": 10, "uncovered": 5}
    report = {"meta": {"command": "x", "date": "d", "seconds": 1.0, "split": "test", "retriever": "r", "encoder": "e"},
              "ceilings": {kb: {"train": c, "test": c} for kb in ("covid-faq", "help-centre", "quillbill")},
              "picked": "dense below 0.4", "candidates": [{"rule": "dense below 0.4", "picked": True, "cells": {
                  kb: {"caught": 0.5, "false": 0.01} for kb in ("covid-faq", "help-centre")}}],
              "test": {kb: per_kb for kb in ("covid-faq", "help-centre", "quillbill")}}
    text = markdown(report)
    assert "Quillbill (held out)" in text and "**dense below 0.4**" in text and "50.0 [40.0, 60.0]" in text


def test_test_rows_pair_the_picked_rule_with_the_automatic_gate_per_knowledge_base():
    from lab.experiments.abstention_signals import KNOWLEDGE_BASES, test_rows

    records = []
    for kb in KNOWLEDGE_BASES:
        records += [SignalRecord(kb, f"in-{i}", "question", True, "test", 1.0, 0.8, False) for i in range(20)]
        records += [SignalRecord(kb, f"out-{i}", "uncovered", False, "test", 0.3, 0.2, i < 5) for i in range(10)]
    probes = {kb: {} for kb in KNOWLEDGE_BASES}
    found = test_rows(records, probes, Rule("automatic, or dense below 0.5", lambda p: 0.5, True), "test")
    quill = found["quillbill"]
    assert quill["automatic"]["caught"]["estimate"] == 0.5 and quill["picked"]["caught"]["estimate"] == 1.0
    assert quill["picked"]["false"]["estimate"] == 0.0
    assert quill["picked - automatic, caught"]["estimate"] == 0.5
