"""Paired comparison of two methods in one bench run: tau over all turns, per-turn wins, and a bootstrap 95%
interval of the tau gain over resampled turns. Usage: python 2026-12-05-paired.py RESULTS.json METHOD_A METHOD_B"""
import json, sys, random
from collections import defaultdict
path, a, b = sys.argv[1:4]
rec = json.load(open(path))['records']
d = defaultdict(dict)
for x in rec:
    d[x['method']][(x['question_id'], x['turn'])] = x
qs = [q for q in d[a] if q in d[b]]
def tau(m, qs): return sum(d[m][q]['new_tokens'] for q in qs) / sum(d[m][q]['target_calls'] for q in qs)
diff = [d[b][q]['new_tokens']/d[b][q]['target_calls'] - d[a][q]['new_tokens']/d[a][q]['target_calls'] for q in qs]
rng = random.Random(0); boots = []
for _ in range(2000):
    s = [rng.choice(qs) for _ in qs]; boots.append(tau(b, s) - tau(a, s))
boots.sort()
print(f"{len(qs)} turns: tau {tau(a,qs):.3f} -> {tau(b,qs):.3f} ({tau(b,qs)-tau(a,qs):+.3f}); better on {sum(x>0 for x in diff)}, worse on {sum(x<0 for x in diff)}; bootstrap 95% [{boots[50]:+.3f}, {boots[1950]:+.3f}]")
