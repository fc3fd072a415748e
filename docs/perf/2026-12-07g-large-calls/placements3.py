import json,sys,collections,statistics
d=collections.defaultdict(list)
def c(x): return 'sib' if x<80 else ('near' if x<250 else 'far')
for l in open(sys.argv[1]):
    r=json.loads(l)
    if c(r['s0'])!=c(r['s1']): continue
    d[(r['coll'], r['size'], c(r['s0']), r['v'])].append(r)
print('collective size placement variant launches | median us out of place, in place')
for k in sorted(d, key=str):
    rs=d[k]
    o=statistics.median(x['oop'] for x in rs); i=statistics.median(x['inp'] for x in rs)
    print(*[str(x).ljust(8) for x in k], str(len(rs)).rjust(4), '| %8.2f %8.2f'%(o,i))
