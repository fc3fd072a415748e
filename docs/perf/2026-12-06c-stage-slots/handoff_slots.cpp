#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <algorithm>
#include <immintrin.h>
#include <pthread.h>
using Clock = std::chrono::steady_clock;
static void pin(int cpu){cpu_set_t s;CPU_ZERO(&s);CPU_SET(cpu,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
struct alignas(128) C{std::atomic<uint64_t> v{0};};
C arr[2];
void meet(int me,uint64_t&c){++c;arr[me].v.store(c,std::memory_order_release);while(arr[1-me].v.load(std::memory_order_acquire)<c)_mm_pause();}
static size_t B=256<<10;
void copyStores(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64){_mm512_store_si512((void*)(d+i),_mm512_load_si512((const void*)(s+i)));}}
void copyNT(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64){_mm512_stream_si512((__m512i*)(d+i),_mm512_load_si512((const void*)(s+i)));}_mm_sfence();}
void flushAfter(const char*s,size_t n){for(size_t i=0;i<n;i+=64)_mm_clflushopt((void*)(s+i));}
double rt(){ std::atomic<int> x{0}; std::vector<double> v;
  std::thread t([&]{pin(1);for(int i=0;i<400;i++){while(x.load()!=2*i+1);x.store(2*i+2);}});
  pin(0);for(int i=0;i<400;i++){auto a=Clock::now();x.store(2*i+1);while(x.load()!=2*i+2);v.push_back(std::chrono::duration<double,std::nano>(Clock::now()-a).count());}
  t.join();std::sort(v.begin(),v.end());return v[v.size()/2];}
// variant: R rotating blocks, mode 0 stores 1 nt 2 stores+reader clflushopt
struct V{int R;int mode;const char*name;};
int main(int argc,char**argv){
  if(argc>1)B=strtoul(argv[1],0,0)<<10;
  V vs[]={{1,0,"R1"},{2,0,"R2"},{4,0,"R4"},{8,0,"R8"},{16,0,"R16"},{1,1,"R1nt"},{1,2,"R1fl"}};
  const int K=sizeof vs/sizeof vs[0];
  for(int rep=0;rep<(argc>2?atoi(argv[2]):10);rep++){
  double r=rt();
  char*src[2],*stg[2],*dst[2];
  std::vector<double> tot[K],w[K];
  arr[0].v=0;arr[1].v=0;
  auto body=[&](int me){pin(me);uint64_t c=0;
    src[me]=(char*)aligned_alloc(4096,B);stg[me]=(char*)aligned_alloc(4096,B*16);dst[me]=(char*)aligned_alloc(4096,B);
    memset(src[me],me+1,B);memset(stg[me],0,B*16);memset(dst[me],0,B);meet(me,c);
    for(int k=0;k<K;k++){ for(int i=0;i<200;i++){ V v=vs[k]; char*sm=stg[me]+(i%v.R)*B; const char*sp=stg[1-me]+(i%v.R)*B;
      meet(me,c);auto a=Clock::now();
      if(v.mode==1)copyNT(sm,src[me],B);else copyStores(sm,src[me],B);
      auto a2=Clock::now();
      meet(me,c);memcpy(dst[me],sp,B); if(v.mode==2)flushAfter(sp,B); meet(me,c);auto e=Clock::now();
      if(me==0&&i>=2*v.R+2){tot[k].push_back(std::chrono::duration<double,std::micro>(e-a).count());w[k].push_back(std::chrono::duration<double,std::micro>(a2-a).count());}
    }}};
  std::thread t0(body,0),t1(body,1);t0.join();t1.join();
  double r2=rt();
  printf("rt %.0f/%.0f ns, us per %zuK handoff (write):",r,r2,B>>10);
  for(int k=0;k<K;k++){std::sort(tot[k].begin(),tot[k].end());std::sort(w[k].begin(),w[k].end());printf(" %s %.1f(%.1f);",vs[k].name,tot[k][tot[k].size()/2],w[k][w[k].size()/2]);}
  printf("\n");fflush(stdout);
  for(int me=0;me<2;me++){free(src[me]);free(stg[me]);free(dst[me]);}
  }
}
