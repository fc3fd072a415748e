/* C consumer built with pkg-config: one rank, one allreduce. */
#include <chorus/chorus.h>
#include <stdio.h>

int main(void) {
  chorusComm_t comm;
  float x[4] = {1, 2, 3, 4}, y[4];
  int version = 0;
  if (chorusGetVersion(&version) != chorusSuccess) return 1;
  if (chorusCommInitAll(&comm, 1, NULL) != chorusSuccess) return 1;
  if (chorusAllReduce(x, y, 4, chorusFloat32, chorusSum, comm, NULL) != chorusSuccess) return 1;
  chorusCommDestroy(comm);
  if (y[3] != 4.0f) return 1;
  printf("c consumer: chorus %d ok\n", version);
  return 0;
}
