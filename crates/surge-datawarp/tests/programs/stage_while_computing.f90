! A Fortran program written for Cray DataWarp's libdatawarp (through bind(C), as Fortran codes
! on Cori did): it stages its input in while it computes, reads the staged bytes, and stages a
! result and a copy out. Built by the libdatawarp tests with gfortran against libdatawarp.so
! and run inside a `surge run` job.
!
! Usage: stage_while_computing_f PFS_DIR  (reads PFS_DIR/in.dat; stages to PFS_DIR/out)
program stage_while_computing_f
  use iso_c_binding
  implicit none

  interface
    integer(c_int) function dw_stage_file_in(dw_file, pfs_file) bind(C, name="dw_stage_file_in")
      import :: c_int, c_char
      character(kind=c_char), dimension(*), intent(in) :: dw_file, pfs_file
    end function
    integer(c_int) function dw_stage_file_out(dw_file, pfs_file, stage_type) &
        bind(C, name="dw_stage_file_out")
      import :: c_int, c_char
      character(kind=c_char), dimension(*), intent(in) :: dw_file, pfs_file
      integer(c_int), value :: stage_type
    end function
    integer(c_int) function dw_query_file_stage(dw_file, complete, pending, deferred, failed) &
        bind(C, name="dw_query_file_stage")
      import :: c_int, c_char
      character(kind=c_char), dimension(*), intent(in) :: dw_file
      integer(c_int), intent(out) :: complete, pending, deferred, failed
    end function
    integer(c_int) function dw_wait_file_stage(dw_file) bind(C, name="dw_wait_file_stage")
      import :: c_int, c_char
      character(kind=c_char), dimension(*), intent(in) :: dw_file
    end function
  end interface

  integer(c_int), parameter :: DW_STAGE_IMMEDIATE = 0, DW_STAGE_AT_JOB_END = 1
  character(len=4096) :: dw, pfs
  character(len=:), allocatable :: dw_in, pfs_in, dw_result
  integer(c_int) :: rc, complete, pending, deferred, failed
  integer(kind=8) :: i, n, total, polls
  integer(kind=1), allocatable :: bytes(:)
  real(kind=8) :: acc

  call get_environment_variable("DW_JOB_STRIPED", dw)
  call get_command_argument(1, pfs)
  if (len_trim(dw) == 0 .or. len_trim(pfs) == 0) stop "usage: DW_JOB_STRIPED and PFS_DIR"
  dw_in = trim(dw) // "/in.dat"
  pfs_in = trim(pfs) // "/in.dat"
  dw_result = trim(dw) // "/result.txt"

  rc = dw_stage_file_in(dw_in // c_null_char, pfs_in // c_null_char)
  call check(rc == 0, "dw_stage_file_in", rc)

  ! The computation, polling the stage between steps.
  acc = 0
  polls = 0
  do
    do i = 1, 200000
      acc = acc + sin(real(i, 8))
    end do
    rc = dw_query_file_stage(dw_in // c_null_char, complete, pending, deferred, failed)
    call check(rc == 0, "dw_query_file_stage", rc)
    polls = polls + 1
    if (complete == 1 .or. failed == 1) exit
  end do
  rc = dw_wait_file_stage(dw_in // c_null_char)
  call check(rc == 0, "dw_wait_file_stage", rc)

  ! Read the staged bytes from the burst buffer.
  open(unit=10, file=dw_in, access="stream", form="unformatted", status="old", action="read")
  inquire(unit=10, size=n)
  allocate(bytes(n))
  read(10) bytes
  close(10)
  total = 0
  do i = 1, n
    total = total + iand(int(bytes(i), 8), 255_8)
  end do

  open(unit=11, file=dw_result, status="replace", action="write")
  write(11, "(I0, 1X, I0)") n, total
  close(11)
  rc = dw_stage_file_out(dw_result // c_null_char, trim(pfs) // "/out/result_f.txt" // c_null_char, &
                         DW_STAGE_IMMEDIATE)
  call check(rc == 0, "dw_stage_file_out", rc)
  rc = dw_wait_file_stage(dw_result // c_null_char)
  call check(rc == 0, "dw_wait_file_stage (result)", rc)
  rc = dw_stage_file_out(dw_in // c_null_char, trim(pfs) // "/out/in_copy.dat" // c_null_char, &
                         DW_STAGE_AT_JOB_END)
  call check(rc == 0, "dw_stage_file_out at job end", rc)
  print "(A, I0, A, F0.3)", "polls ", polls, " compute ", acc

contains

  subroutine check(ok, what, rc)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    integer(c_int), intent(in) :: rc
    if (.not. ok) then
      print "(A, A, I0)", what, " returned ", rc
      stop 1
    end if
  end subroutine

end program
