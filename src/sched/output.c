/* The simulator's outputs: summary.json and gnuplot plots. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sched/sched.h"


static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

static void json_number(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.6g", v);
  else fputs("null", f);
}

static void write_run(FILE *f, const tide_sim_result_t *r) {
  int left;
  double avg = tide_sim_result_avg_jct(r, &left);
  fputs("    {\"policy\": ", f);
  json_string(f, r->policy);
  fputs(", \"workload\": ", f);
  json_string(f, r->workload);
  fputs(", \"avg_jct\": ", f);
  json_number(f, avg);
  fprintf(f, ", \"incomplete\": %d, \"makespan\": ", left);
  json_number(f, r->makespan);
  fputs(", \"round_mean_s\": ", f);
  json_number(f, r->round_mean);
  fputs(", \"round_max_s\": ", f);
  json_number(f, r->round_max);
  fputs(",\n     \"jobs\": [", f);
  for (int j = 0; j < r->njobs; j++) {
    const tide_sim_job_t *job = &r->jobs[j];
    fputs(j ? ",\n       {\"name\": " : "\n       {\"name\": ", f);
    json_string(f, job->name);
    fputs(", \"application\": ", f);
    json_string(f, job->application);
    fputs(", \"submit\": ", f);
    json_number(f, job->submit);
    fputs(", \"start\": ", f);
    json_number(f, job->start >= 0 ? job->start : NAN);
    fputs(", \"finish\": ", f);
    json_number(f, job->finish >= 0 ? job->finish : NAN);
    fputs(", \"jct\": ", f);
    json_number(f, job->finish >= 0 ? job->finish - job->submit : NAN);
    fprintf(f, ", \"resizes\": %d, \"batch\": ", job->resizes);
    json_number(f, job->batch);
    fputc('}', f);
  }
  fputs("],\n     \"timeline\": [", f);
  for (int i = 0; i < r->nrounds; i++) {
    const tide__sim_round_t *rec = &r->rounds[i];
    fputs(i ? ",\n       [" : "\n       [", f);
    json_number(f, rec->time);
    fputs(", [", f);
    for (int c = 0; c < rec->count; c++) {
      const int *cell = r->cells[rec->first + c];
      fprintf(f, "%s[%d, %d, %d]", c ? ", " : "", cell[0], cell[1], cell[2]);
    }
    fputs("]]", f);
  }
  fputs("]}", f);
}

int tide_sim_write_summary(const tide_sim_result_t *const *runs, int n, const char *path) {
  if (runs == NULL || path == NULL) return tide__null_arg("tide_sim_write_summary", "runs or path");
  if (n < 0) {
    TIDE_ERROR("tide_sim_write_summary: n = %d runs; give 0 or more", n);
    return TIDE_EINVAL;
  }
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    TIDE_ERROR("sim: cannot write %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  fputs("{\n  \"runs\": [\n", f);
  for (int i = 0; i < n; i++) {
    if (i) fputs(",\n", f);
    write_run(f, runs[i]);
  }
  fputs("\n  ],\n  \"mean_avg_jct\": {", f);
  int first = 1;
  for (int i = 0; i < n; i++) {
    int seen = 0;
    for (int k = 0; k < i && !seen; k++) seen = strcmp(runs[k]->policy, runs[i]->policy) == 0;
    if (seen) continue;
    double sum = 0;
    int count = 0;
    for (int k = i; k < n; k++)
      if (strcmp(runs[k]->policy, runs[i]->policy) == 0) sum += tide_sim_result_avg_jct(runs[k], NULL), count++;
    fprintf(f, "%s\"%s\": ", first ? "" : ", ", runs[i]->policy);
    json_number(f, sum / count);
    first = 0;
  }
  fputs("}\n}\n", f);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    TIDE_ERROR("sim: writing %s failed", path);
    return TIDE_EIO;
  }
  return 0;
}

static FILE *open_in(const char *dir, const char *name, char *path, size_t len) {
  snprintf(path, len, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (f == NULL) TIDE_ERROR("sim: cannot write %s: %s", path, strerror(errno));
  return f;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int tide_sim_plot(const tide_sim_result_t *const *runs, int n, const char *dir, int *plotted) {
  if (runs == NULL || dir == NULL) return tide__null_arg("tide_sim_plot", "runs or dir");
  if (n < 1) {
    TIDE_ERROR("tide_sim_plot: n = %d runs; give at least 1", n);
    return TIDE_EINVAL;
  }
  char path[4096];
  if (plotted) *plotted = 0;
  FILE *gp = open_in(dir, "plots.gp", path, sizeof path);
  if (gp == NULL) return TIDE_EIO;
  fputs("set terminal pngcairo size 900,600\nset key bottom right\nset grid\n", gp);
  fputs("set output 'jct-cdf.png'\nset title 'JCT CDF'\nset xlabel 'JCT (s)'\nset logscale x\n"
        "set ylabel 'fraction of jobs'\nplot ",
        gp);
  int rc = 0, firstplot = 1;
  for (int i = 0; i < n && rc == 0; i++) {
    int seen = 0;
    for (int k = 0; k < i && !seen; k++) seen = strcmp(runs[k]->policy, runs[i]->policy) == 0;
    if (seen) continue;
    char name[64];
    snprintf(name, sizeof name, "jct-%s.dat", runs[i]->policy);
    FILE *f = open_in(dir, name, path, sizeof path);
    if (f == NULL) {
      rc = TIDE_EIO;
      break;
    }
    size_t total = 0;
    for (int k = i; k < n; k++)
      if (strcmp(runs[k]->policy, runs[i]->policy) == 0) total += (size_t)runs[k]->njobs;
    double *jct = tide__malloc((total ? total : 1) * sizeof *jct);
    if (jct == NULL) {
      fclose(f);
      rc = TIDE_ENOMEM;
      break;
    }
    size_t m = 0;
    for (int k = i; k < n; k++)
      if (strcmp(runs[k]->policy, runs[i]->policy) == 0)
        for (int j = 0; j < runs[k]->njobs; j++)
          if (runs[k]->jobs[j].finish >= 0) jct[m++] = runs[k]->jobs[j].finish - runs[k]->jobs[j].submit;
    qsort(jct, m, sizeof *jct, cmp_double);
    for (size_t k = 0; k < m; k++) fprintf(f, "%g %g\n", jct[k], (k + 1.0) / total);
    tide__free(jct);
    fclose(f);
    fprintf(gp, "%s'%s' using 1:2 with steps title '%s'", firstplot ? "" : ", ", name, runs[i]->policy);
    firstplot = 0;
  }
  fputs("\nunset logscale x\n", gp);
  /* Slots in use over time and each job's slots, first run per policy. */
  fputs("set output 'slots.png'\nset title 'slots in use'\nset xlabel 'time (s)'\nset ylabel 'slots'\n"
        "set key top right\nplot ",
        gp);
  firstplot = 1;
  for (int i = 0; i < n && rc == 0; i++) {
    int seen = 0;
    for (int k = 0; k < i && !seen; k++) seen = strcmp(runs[k]->policy, runs[i]->policy) == 0;
    if (seen) continue;
    char name[64];
    snprintf(name, sizeof name, "slots-%s.dat", runs[i]->policy);
    FILE *f = open_in(dir, name, path, sizeof path);
    if (f == NULL) {
      rc = TIDE_EIO;
      break;
    }
    for (int k = 0; k < runs[i]->nrounds; k++) {
      const tide__sim_round_t *rec = &runs[i]->rounds[k];
      int used = 0;
      for (int c = 0; c < rec->count; c++) used += runs[i]->cells[rec->first + c][2];
      fprintf(f, "%g %d\n", rec->time, used);
    }
    fclose(f);
    fprintf(gp, "%s'%s' using 1:2 with steps title '%s'", firstplot ? "" : ", ", name, runs[i]->policy);
    firstplot = 0;
    snprintf(name, sizeof name, "alloc-%s.dat", runs[i]->policy);
    f = open_in(dir, name, path, sizeof path);
    if (f == NULL) {
      rc = TIDE_EIO;
      break;
    }
    for (int k = 0; k < runs[i]->nrounds; k++) {
      const tide__sim_round_t *rec = &runs[i]->rounds[k];
      /* cells are grouped by job: sum each job's slots */
      for (int c = 0; c < rec->count;) {
        int job = runs[i]->cells[rec->first + c][0], sum = 0;
        while (c < rec->count && runs[i]->cells[rec->first + c][0] == job) sum += runs[i]->cells[rec->first + c++][2];
        fprintf(f, "%g %d %d\n", rec->time, job, sum);
      }
    }
    fclose(f);
  }
  fputc('\n', gp);
  for (int i = 0; i < n && rc == 0; i++) {
    int seen = 0;
    for (int k = 0; k < i && !seen; k++) seen = strcmp(runs[k]->policy, runs[i]->policy) == 0;
    if (seen) continue;
    fprintf(gp,
            "set output 'allocation-%s.png'\nset title 'slots per job (%s)'\nset xlabel 'time (s)'\n"
            "set ylabel 'job'\nset cblabel 'slots'\nset palette rgb 33,13,10\n"
            "plot 'alloc-%s.dat' using 1:2:3 with points pt 5 ps 0.4 palette notitle\n",
            runs[i]->policy, runs[i]->policy, runs[i]->policy);
  }
  if (fclose(gp) != 0 && rc == 0) rc = TIDE_EIO;
  if (rc != 0) return rc;
  if (tide__gnuplot(dir, "plots.gp") > 0 && plotted != NULL) *plotted = 1;
  return 0;
}
