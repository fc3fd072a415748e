import json,sys
def f(c,n):
    n=float(n)
    return {'all_reduce':(n-1)/(n*n),'all_gather':(n-1)/(n*(n+1)),'reduce_scatter':(n-1)/(n*(n+1))}[c]
cur=None; rows=[]
for l in open(sys.argv[1]):
    if l.startswith('=='): cur=l.split(); continue
    if l.startswith('{'):
        d=json.loads(l); n=d['ranks']; c=d['collective']; fl=f(c,n)*d['copy_gbps']
        rows.append((cur[2],n,cur[6],c,d['oop_time_us']/1e3,100*d['oop_busbw']/fl,d['ip_time_us']/1e3,100*d['ip_busbw']/fl,d['copy_gbps']))
    elif 'spin' in l and rows: rows[-1]=rows[-1]+(float(l.split()[4]),)
print('round ranks memalloc collective        oop ms %floor   ip ms %floor  copy GB/s  spin ns after')
for r in rows: print('%5s %5d %8s %-15s %8.1f %5.0f%% %7.1f %5.0f%% %9.1f %8.0f' % r)
