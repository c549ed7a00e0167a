/* The device-side state of one GPU selection, shared by the host code (C)
 * and the kernels (CUDA C++, compiled at run time with this file as a
 * header). Plain 64- and 32-bit fields in an order that pads the same for
 * both compilers. The kernels take every decision on the device (which
 * source a pass reads, whether a stage runs), so the host queues a fixed
 * sequence and waits once, at the end. */
#ifndef TIDE_GPU_STATE_H
#define TIDE_GPU_STATE_H

#define TIDE__GPU_NONE 0xffffffffffffffffull /* bad_index when every element is finite */
#define TIDE__GPU_THREADS 256                /* threads per block of every kernel */
#define TIDE__GPU_BINS 2048                  /* histogram bins of the widest digit */
#define TIDE__GPU_HISTS 16                   /* histogram slots: one per pass queued */
#define TIDE__GPU_BUCKET 1024                /* the k-th key's last bucket the emission ranks itself */

/* Stages of the histogram passes (tide_gpu_hist's `stage`). */
#define TIDE__GPU_STAGE_MAG 0     /* the k-th largest magnitude key */
#define TIDE__GPU_STAGE_TIE 1     /* the lowest indices among keys equal to it */
#define TIDE__GPU_STAGE_BAND_HI 2 /* MSTopK: the band's index of rank offset + need */
#define TIDE__GPU_STAGE_BAND_LO 3 /* MSTopK: the band's index of rank offset */

/* Selector kinds as the kernels see them. */
#define TIDE__GPU_EXACT 0
#define TIDE__GPU_MSTOPK 1

typedef struct {
  /* set by the host */
  unsigned long long d, k;
  unsigned long long cap; /* list entries the scratch holds */
  unsigned long long seed;
  unsigned long long bad_index; /* the lowest index of a NaN/Inf, TIDE__GPU_NONE if none */
  /* radix selection over 2 or 3 digits: value bits fixed so far */
  unsigned long long rank;  /* 1-based rank sought among the class elements matching prefix */
  unsigned long long above; /* class elements above the prefix bucket */
  unsigned long long equal; /* elements equal to the selected value (after the last digit) */
  unsigned long long count; /* a counting pass's total */
  unsigned long long list_len;
  unsigned long long written; /* pairs emitted */
  unsigned long long candidates;
  unsigned long long k1, k2, band, need, offset; /* MSTopK */
  double base, top, lo_f, hi_f;                  /* MSTopK: mean|x|, max|x|, bisection bounds */
  unsigned int prefix, mask;
  unsigned int use_list;     /* the passes read the list (key, index), not x */
  unsigned int collect;      /* the collection pass after the first histogram runs */
  unsigned int list_cut;     /* the list holds every element with key >= list_cut */
  unsigned int overflow;     /* a collection passed cap */
  unsigned int fallback;     /* sampled: the sample's cut missed */
  unsigned int full_passes;  /* passes that read all of x */
  unsigned int kth;          /* the k-th largest key */
  unsigned int tie_needed;   /* fewer of the keys equal to kth are taken than there are */
  unsigned int tie_index;    /* those with index <= tie_index are */
  unsigned int key1, key2;   /* MSTopK's t1, t2 as keys */
  unsigned int hi_index, lo_index;
  unsigned int min_taken;    /* the smallest key emitted */
  unsigned int max_key;
  unsigned int blocks_done;  /* the last-block ticket of the kernel running */
  unsigned int failed;       /* an internal check failed (rank beyond the class) */
  unsigned int digits;       /* digits of the k-th largest key known (3: all) */
} tide__gpu_state_t;

#endif
