"""Computation problems: exact-integer questions too large to do in one's head, each with the code that solves it.

Kinds: primes below N (N ~ 1e5..1e6), modular exponentiation, days between two dates, digit sum of N!, sums of
sequences, Fibonacci numbers mod M, Collatz step counts. Each Problem carries the oracle's solution and a
plausible slip (an off-by-one variant of the code and the wrong value it prints), so the scripted teacher can
make, and then catch, an arithmetic mistake:

    metadata["solution"] = {"kind": ..., "steps": [{"tool": "code", "argument": "```python\\n...\\n```",
                            "finding": "<stdout>"}], "slip": {"argument": ..., "finding": ..., "why": ...}}

Answers are computed here in Python (the same logic as the code shown); tests run the code to prove they agree.

Usage:
    problems = computation_problems(n=50, rng_seed=0, split="train")
"""
from __future__ import annotations

import datetime as dt
import math
import random
from typing import Callable

from problems.records import Problem


def _fence(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def _prime_count(limit: int, count_one: bool = False) -> int:
    sieve = bytearray([1]) * limit
    sieve[0] = 0
    if not count_one:
        sieve[1] = 0
    for i in range(2, math.isqrt(limit - 1) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytearray(len(range(i * i, limit, i)))
    return sum(sieve)


_PRIME_CODE = """
n = {n}
sieve = bytearray([1]) * n
sieve[0] = 0{mark_one}
for i in range(2, int((n - 1) ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i::i] = bytearray(len(range(i * i, n, i)))
print(sum(sieve))
"""


def _primes(rng: random.Random) -> tuple:
    n = rng.randint(100_000, 1_000_000)
    return (
        f"How many prime numbers are there below {n}?",
        _prime_count(n),
        _PRIME_CODE.format(n=n, mark_one="\nsieve[1] = 0"),
        _PRIME_CODE.format(n=n, mark_one=""),
        _prime_count(n, count_one=True),
        "forgot that 1 is not prime",
    )


def _modpow(rng: random.Random) -> tuple:
    a, b, m = rng.randint(1_000, 99_999), rng.randint(100_000, 10**9), rng.randint(10**6, 10**9 + 7)
    right, wrong = pow(a, b, m), pow(a, b - 1, m)
    if right == wrong:
        return None
    return (
        f"What is {a} raised to the power {b}, modulo {m}?",
        right, f"print(pow({a}, {b}, {m}))", f"print(pow({a}, {b} - 1, {m}))", wrong, "exponent off by one",
    )


def _date_diff(rng: random.Random) -> tuple:
    start = dt.date(1900, 1, 1) + dt.timedelta(days=rng.randint(0, 60_000))
    end = start + dt.timedelta(days=rng.randint(1_000, 40_000))
    days = (end - start).days
    code = (f"import datetime\nstart = datetime.date({start.year}, {start.month}, {start.day})\n"
            f"end = datetime.date({end.year}, {end.month}, {end.day})\n")
    return (
        f"How many days are there from {start.isoformat()} to {end.isoformat()}?",
        days, code + "print((end - start).days)", code + "print((end - start).days + 1)", days + 1,
        "counted both end dates",
    )


def _factorial_digit_sum(rng: random.Random) -> tuple:
    n = rng.randint(200, 1500)
    right = sum(map(int, str(math.factorial(n))))
    wrong = sum(map(int, str(math.factorial(n - 1))))
    if right == wrong:
        return None
    return (
        f"What is the sum of the digits of {n}! ({n} factorial)?",
        right, f"import math\nprint(sum(int(d) for d in str(math.factorial({n}))))",
        f"import math\nprint(sum(int(d) for d in str(math.factorial({n} - 1))))", wrong, "factorial of n-1",
    )


# Closed forms (the code shown loops; the closed forms keep generating thousands of problems fast).
def _square_sum(n: int) -> int:
    return n * (n + 1) * (2 * n + 1) // 6


def _multiples_sum(n: int) -> int:
    def below(step: int) -> int:
        count = n // step
        return step * count * (count + 1) // 2
    return below(3) + below(7) - below(21)


def _odd_cube_sum(n: int) -> int:
    return n * n * (2 * n * n - 1)


def _sequence_sum(rng: random.Random) -> tuple:
    n = rng.randint(10_000, 2_000_000)
    variant = rng.choice(["squares", "multiples", "odd_cubes"])
    if variant == "squares":
        q = f"What is the sum of k squared for k from 1 to {n}?"
        right, wrong = _square_sum(n), _square_sum(n - 1)
        code, slip = (f"print(sum(k * k for k in range(1, {n} + 1)))", f"print(sum(k * k for k in range(1, {n})))")
    elif variant == "multiples":
        q = f"What is the sum of all positive integers up to and including {n} that are multiples of 3 or 7?"
        right, wrong = _multiples_sum(n), _multiples_sum(n - 1)
        code = f"print(sum(k for k in range(1, {n} + 1) if k % 3 == 0 or k % 7 == 0))"
        slip = f"print(sum(k for k in range(1, {n}) if k % 3 == 0 or k % 7 == 0))"
    else:
        q = f"What is the sum of the cubes of the first {n} odd numbers?"
        right, wrong = _odd_cube_sum(n), _odd_cube_sum(n - 1)
        code, slip = (f"print(sum((2 * k + 1) ** 3 for k in range({n})))",
                      f"print(sum((2 * k + 1) ** 3 for k in range({n} - 1)))")
    if right == wrong:
        return None
    return q, right, code, slip, wrong, "range stops one term early"


_FIB_CODE = """
a, b = 0, 1
for _ in range({steps}):
    a, b = b, (a + b) % {m}
print(a)
"""


def _fib_mod(rng: random.Random) -> tuple:
    n, m = rng.randint(10_000, 500_000), rng.randint(1_000, 10**9)
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, (a + b) % m
    right, wrong = b, a  # F(n), F(n-1)
    if right == wrong:
        return None
    return (
        f"With F(0) = 0 and F(1) = 1, what is the Fibonacci number F({n}) modulo {m}?",
        right, _FIB_CODE.format(steps=n, m=m), _FIB_CODE.format(steps=f"{n} - 1", m=m), wrong, "index off by one",
    )


_COLLATZ_CODE = """
n, steps = {n}, 0
while n != 1:
    n = n // 2 if n % 2 == 0 else 3 * n + 1
    steps += 1
print(steps{plus})
"""


def _collatz(rng: random.Random) -> tuple:
    start = rng.randint(10**5, 10**9)
    n, steps = start, 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return (
        f"Starting from {start}, how many steps does the Collatz rule (halve if even, else 3n+1) take to reach 1?",
        steps, _COLLATZ_CODE.format(n=start, plus=""), _COLLATZ_CODE.format(n=start, plus=" + 1"), steps + 1,
        "counted the terms instead of the steps",
    )


KINDS: dict[str, Callable[[random.Random], tuple | None]] = {
    "prime_count": _primes, "modpow": _modpow, "date_diff": _date_diff, "factorial_digit_sum": _factorial_digit_sum,
    "sequence_sum": _sequence_sum, "fibonacci_mod": _fib_mod, "collatz_steps": _collatz,
}


def computation_problems(n: int, rng_seed: int = 0, split: str = "train",
                         kinds: tuple[str, ...] = tuple(KINDS)) -> list[Problem]:
    """`n` distinct problems cycling through `kinds`; the same (n, rng_seed, split, kinds) gives the same list.
    Splits draw from different seed spaces, so train and test questions come from independent streams."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"computation_problems: unknown kinds {unknown}; choose from {list(KINDS)}")
    rng = random.Random(f"afm-computation:{split}:{rng_seed}")
    problems: list[Problem] = []
    seen: set[str] = set()
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > n * 20:
            raise RuntimeError(
                f"computation_problems: only {len(problems)} of {n} distinct problems after {attempts} tries")
        kind = kinds[len(problems) % len(kinds)]
        made = KINDS[kind](rng)
        if made is None or made[0] in seen:
            continue
        question, answer, code, slip_code, slip_value, why = made
        seen.add(question)
        problems.append(Problem(
            id=f"comp-{split}-{rng_seed}-{len(problems)}", question=question + " Give the exact integer.",
            answers=[str(answer)], family="computation", split=split, source=f"computation:{kind}",
            metadata={"solution": {
                "kind": kind,
                "steps": [{"tool": "code", "argument": _fence(code), "finding": str(answer)}],
                "slip": {"argument": _fence(slip_code), "finding": str(slip_value), "why": why},
            }},
        ))
    return problems
